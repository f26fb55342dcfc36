"""Lightning's sharded strategies through glaunch: every rank's share of a checkpoint directory
committed through the protocol, resumed bitwise after a stop at a time limit's warning and a
requeue (the local scheduler's own time limit is tests/runner/test_local_requeue.py's).

FSDP (examples/lightning_fsdp.py) runs for real on the CPU over gloo.

DeepSpeed (examples/lightning_deepspeed.py): Lightning trains it on CUDA GPUs only. The part
that needs a GPU is exactly this, in Lightning's DeepSpeedStrategy:

1. ``setup_environment`` refuses every accelerator but ``CUDAAccelerator`` ("The DeepSpeed
   strategy is only supported on CUDA GPUs");
2. its devices must carry indexes equal to the local ranks: ``setup_distributed`` checks
   them and ``deepspeed.initialize`` gets ``root_device.index`` as the device rank; CPU
   devices have no index.

``MOCK_CUDA_ONLY_PART`` below is a mock of those two and nothing else: the accelerator check
is skipped and the CPU devices are numbered ``cpu:LOCAL_RANK``. The rest runs for real:
glaunch's ds_config.json, Lightning's DeepSpeedStrategy and checkpoint connector, DeepSpeed's
ZeRO-2 engine on its CPU accelerator over gloo, and glaunch's staging, commit and resume.
Unmocked, on a GPU, scripts/gpu-check runs both examples with a requeue and a resume.
"""

from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.runtime import stop

pytest.importorskip("lightning")
REPO = Path(__file__).resolve().parents[2]
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")

MOCK_CUDA_ONLY_PART = """\
# Mock of the CUDA-only part of Lightning's DeepSpeedStrategy (see tests/runtime/test_lightning_strategies.py).
import runpy
import sys

import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy


def setup_environment(self):
    self.parallel_devices = [torch.device("cpu", i) for i in range(len(self.parallel_devices))]
    DDPStrategy.setup_environment(self)


DeepSpeedStrategy.setup_environment = setup_environment
sys.argv[0] = {example!r}
runpy.run_path({example!r}, run_name="__main__")
"""


def submit(runs: Path, env, example: str, *overrides: str) -> tuple[Path, str]:
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", example, "--runs-dir", str(runs),
                           *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    (run_dir,) = runs.iterdir()
    logs = "".join(p.read_text(errors="replace")[-3000:] for p in sorted((run_dir / "logs").glob("*_log.err")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    return run_dir, proc.stdout


def newest_manifest(run_dir: Path) -> dict:
    steps = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("step-"))
    return json.loads((steps[-1] / "manifest.json").read_text())


def owners(manifest: dict) -> dict[str, int | None]:
    return {s["path"]: s["rank"] for s in manifest["shards"]}


# The script (SCRIPT), warned of its time limit in its first start: after its optimizer step
# STEP each rank sends itself SIGUSR2, as the local scheduler's --signal does at a limit's
# warning. A warning at a time instead left a start slowed by a busy machine's start-up
# one step of training, and the run 20 starts.
WARNED_AT_STEP = """\
import os
import runpy
import signal
import sys

from torch.optim.optimizer import register_optimizer_step_post_hook

optimizer_steps = [0]


def warn(optimizer, args, kwargs):
    optimizer_steps[0] += 1
    if optimizer_steps[0] == {step} and os.environ.get("GLAUNCH_RESTART") == "0":
        os.kill(os.getpid(), signal.SIGUSR2)


register_optimizer_step_post_hook(warn)
sys.argv[0] = {script!r}
runpy.run_path({script!r}, run_name="__main__")
"""


def requeued_and_resumed_bitwise(tmp_path, env, example: str, steps: int, script: Path, *overrides: str) -> Path:
    """An uninterrupted run of `script` and one its limit's warning stops half-way through its
    first start, which is requeued and resumed: the same parameters."""
    base_dir, _ = submit(tmp_path / "base", env, example, f"entrypoint.script={script}",
                         f"entrypoint.args=[--steps,{steps}]", *overrides)
    warned = tmp_path / "warned.py"
    warned.write_text(WARNED_AT_STEP.format(step=steps // 2, script=str(script)))
    cut_dir, out = submit(tmp_path / "cut", env, example, f"entrypoint.script={warned}", "requeue.max=2",
                          "checkpoint.every_steps=100", f"entrypoint.args=[--steps,{steps}]", *overrides)
    record = json.loads((cut_dir / "run.json").read_text())
    states = [(s["state"], s["reason"]) for s in record["starts"]]
    assert states == [("REQUEUED", "timeout"), ("COMPLETED", None)], states
    assert "stopping at step" in out and "resumed from" in out, out[-3000:]
    base = json.loads((base_dir / "result.json").read_text())
    cut = json.loads((cut_dir / "result.json").read_text())
    assert cut["final_step"] == base["final_step"] == steps
    assert steps // 2 <= cut["resumed_from"] < steps
    assert cut["param_sha256"] == base["param_sha256"]
    return cut_dir


def test_lightning_fsdp_stops_and_resumes_bitwise_on_cpu(tmp_path, isolated_env):
    cut_dir = requeued_and_resumed_bitwise(tmp_path, isolated_env, "examples/lightning_fsdp.yaml", 20,
                                           REPO / "examples" / "lightning_fsdp.py")
    manifest = newest_manifest(cut_dir)
    # Each rank's DCP shard is in its own done marker, as are meta.pt and .metadata (rank 0).
    assert owners(manifest) == {
        "lightning.ckpt/.metadata": 0, "lightning.ckpt/__0_0.distcp": 0, "lightning.ckpt/__1_0.distcp": 1,
        "lightning.ckpt/meta.pt": 0, "rng-rank-00000.pt": 0, "rng-rank-00001.pt": 1,
    }
    assert manifest["extra"]["strategy"] == "GlaunchFSDPStrategy"
    assert json.loads((cut_dir / "result.json").read_text())["placement"]["device"] == "cpu"


def test_lightning_deepspeed_zero2_stops_and_resumes_bitwise_with_cuda_only_part_mocked(tmp_path, isolated_env):
    entry = tmp_path / "lightning_deepspeed_cpu.py"
    entry.write_text(MOCK_CUDA_ONLY_PART.format(example=str(REPO / "examples/lightning_deepspeed.py")))
    # DeepSpeed's CPU communication op is compiled on first use into torch's extension cache:
    # the machine's cache, not one in the test's empty HOME (a build of minutes per run).
    cache = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "torch_extensions"
    cut_dir = requeued_and_resumed_bitwise(tmp_path, isolated_env, "examples/lightning_deepspeed.yaml", 20, entry,
                                           f"env.TORCH_EXTENSIONS_DIR={cache}")
    manifest = newest_manifest(cut_dir)
    claimed = owners(manifest)
    # DeepSpeed's files, each in the done marker of the rank that wrote it; its `latest` and
    # helper scripts, written by rank 0 outside its checkpoint engine, checksummed at commit.
    assert claimed["lightning.ckpt/checkpoint/mp_rank_00_model_states.pt"] == 0
    assert claimed["lightning.ckpt/checkpoint/zero_pp_rank_0_mp_rank_00_optim_states.pt"] == 0
    assert claimed["lightning.ckpt/checkpoint/zero_pp_rank_1_mp_rank_00_optim_states.pt"] == 1
    assert claimed["lightning.ckpt/latest"] is None
    assert (claimed["rng-rank-00000.pt"], claimed["rng-rank-00001.pt"]) == (0, 1)
    assert manifest["extra"]["strategy"] == "DeepSpeedStrategy"


def test_lightning_ddp_still_commits_one_file_from_rank_zero(tmp_path, isolated_env):
    run_dir, out = submit(tmp_path / "runs", isolated_env, "examples/lightning_ddp.yaml",
                          "entrypoint.args=[--steps,10]", "checkpoint.every_steps=5")
    assert "done: step 10" in out
    assert owners(newest_manifest(run_dir)) == {"lightning.ckpt": 0, "rng-rank-00000.pt": 0,
                                                "rng-rank-00001.pt": 1}


# --- the strategies' wiring, in this process -----------------------------------------------------


@pytest.fixture
def rank_env(monkeypatch, tmp_path):
    """A stand-alone rank with its run dir in tmp; environment and signal handlers restored after."""
    for k in [*RANK_VARS, "PL_GLOBAL_SEED",
              *(k for k in os.environ if k.startswith(("GLAUNCH_", "SLURM_", "TORCHELASTIC")))]:
        monkeypatch.setenv(k, "")          # registered, so whatever the code under test sets is undone
        monkeypatch.delenv(k)
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path / "run"))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    yield monkeypatch
    stop.uninstall_stop_handler()
    stop.reset_stop()
    for s, h in handlers.items():
        signal.signal(s, h)


def rendered_ds_config(tmp_path, *overrides: str) -> Path:
    run = api.submit(str(REPO / "examples/lightning_deepspeed.yaml"), site="local", dry_run=True,
                     runs_dir=str(tmp_path / "runs"), overrides=list(overrides))
    return Path(run.run_dir) / "ds_config.json"


def test_lightning_deepspeed_strategy_from_glaunchs_ds_config(tmp_path, rank_env, isolated_env):
    pytest.importorskip("deepspeed")
    from lightning.pytorch.strategies import DeepSpeedStrategy

    from launcher.runtime.deepspeed import ds_config
    from launcher.runtime.lightning import trainer_deepspeed

    path = rendered_ds_config(tmp_path, "precision=bf16")
    rendered = json.loads(path.read_text())
    assert rendered["zero_optimization"]["stage"] == 2 and rendered["gradient_accumulation_steps"] == 2
    rank_env.setenv("GLAUNCH_DS_CONFIG", str(path))
    options = trainer_deepspeed(ds_config({"zero_optimization": {"stage": 3}}))
    strategy = options["strategy"]
    assert type(strategy) is DeepSpeedStrategy
    assert options["accumulate_grad_batches"] == 2
    assert "gradient_accumulation_steps" not in strategy.config      # Lightning refuses it there
    assert strategy.config["zero_optimization"]["stage"] == 2
    assert (strategy.config["train_batch_size"], strategy.config["train_micro_batch_size_per_gpu"]) == (32, 8)
    assert rendered["bf16"] == {"enabled": True}
    assert strategy.config["bf16"] == {"enabled": False}              # the CPU trains in fp32
    assert strategy.config["zero_allow_untested_optimizer"] is True   # the LightningModule's AdamW
    assert strategy.process_group_backend == "gloo"                   # this machine has no GPU
    assert rendered["gradient_accumulation_steps"] == 2 and "zero_allow_untested_optimizer" not in rendered


def test_lightning_deepspeed_example_builds_its_trainer_and_lightning_refuses_the_cpu(tmp_path, rank_env,
                                                                                    isolated_env):
    """The Trainer the example builds, then Lightning's refusal without CUDA (the unmocked part)."""
    pytest.importorskip("deepspeed")
    import importlib.util

    import lightning as L

    rank_env.setenv("GLAUNCH_DS_CONFIG", str(rendered_ds_config(tmp_path)))
    spec = importlib.util.spec_from_file_location("lightning_deepspeed_example",
                                                  REPO / "examples/lightning_deepspeed.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    built = {}
    real_trainer = L.Trainer

    def trainer(**kwargs):
        built.update(kwargs)
        return real_trainer(**kwargs)

    rank_env.setattr(L, "Trainer", trainer)
    with pytest.raises(RuntimeError, match="only supported on CUDA GPUs"):
        example.main(["--steps", "2"])
    assert type(built["strategy"]).__name__ == "DeepSpeedStrategy"
    assert (built["accelerator"], built["accumulate_grad_batches"]) == ("cpu", 2)   # ds_config.json's
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_lightning_fsdp_strategy_and_precision_on_cpu(rank_env, capfd):
    from launcher.runtime.lightning import (
        GlaunchFSDPStrategy,
        trainer_fsdp_strategy,
        trainer_precision,
    )

    strategy = trainer_fsdp_strategy()
    assert type(strategy) is GlaunchFSDPStrategy
    assert (strategy.process_group_backend, strategy._state_dict_type) == ("gloo", "sharded")
    rank_env.setenv("GLAUNCH_PRECISION", "bf16")
    # The CPU trains in fp32 whatever the strategy (Lightning's FSDP autocasts on CUDA only anyway).
    assert trainer_precision() == "32-true"
    assert "Trainer precision 32-true: fp32 (bf16 configured; the CPU trains in fp32)" in capfd.readouterr().err
