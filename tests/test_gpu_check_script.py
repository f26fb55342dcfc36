"""scripts/gpu-check and scripts/gpu-check-memory, run by hand on a GPU machine: here, what
needs no GPU. Both parse (bash -n, shellcheck; the Python imports); without a GPU each says
so and stops (exit 2) before installing or training anything; --dry-run renders every
example (bf16) and prints the planner's figures for the Llama-shaped model; that model has
the parameters the planner is told."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU_CHECK = REPO / "scripts" / "gpu-check"
MEMORY = REPO / "scripts" / "gpu-check-memory"


def memory_module():
    loader = importlib.machinery.SourceFileLoader("gpu_check_memory", str(MEMORY))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module        # dataclasses look their module up
    loader.exec_module(module)
    return module


def no_gpu_env(tmp_path: Path, *, nvidia_smi: bool) -> dict[str, str]:
    """This environment with a PATH whose nvidia-smi fails (or answers, `nvidia_smi`) and
    whose torch sees no GPU."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: GPU-0)'\n" if nvidia_smi else
                   "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\n"
                   "exit 9\n")
    smi.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", CUDA_VISIBLE_DEVICES="",
                PYTHONPATH=str(REPO), OUT=str(tmp_path / "out"), PYTHON=sys.executable)


def test_gpu_check_parses():
    assert subprocess.run(["bash", "-n", str(GPU_CHECK)], timeout=30).returncode == 0
    if shutil.which("shellcheck"):
        check = subprocess.run(["shellcheck", str(GPU_CHECK)], capture_output=True, text=True, timeout=60)
        assert check.returncode == 0, check.stdout
    assert os.access(GPU_CHECK, os.X_OK) and os.access(MEMORY, os.X_OK)


def test_gpu_check_without_a_gpu_says_so_and_runs_nothing(tmp_path):
    proc = subprocess.run([str(GPU_CHECK)], env=no_gpu_env(tmp_path, nvidia_smi=False), capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "gpu-check: no GPU here: nvidia-smi -L failed (NVIDIA-SMI has failed" in proc.stderr
    assert "Traceback" not in proc.stderr
    summary = (tmp_path / "out" / "gpu-check.txt").read_text()
    assert "# FAIL no GPU" in summary and not (tmp_path / "out" / "pip.txt").exists()


def test_gpu_check_where_torch_sees_no_gpu_says_so(tmp_path):
    env = no_gpu_env(tmp_path, nvidia_smi=True)
    try:
        subprocess.run([sys.executable, "-c", "import torch, lightning, deepspeed"], env=env, check=True,
                       capture_output=True, timeout=120)
    except subprocess.CalledProcessError:
        pytest.skip("torch, lightning or deepspeed missing: gpu-check would install them")
    proc = subprocess.run([str(GPU_CHECK)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no GPU here: torch sees no CUDA GPU (torch.cuda.is_available() is False)" in proc.stderr


def test_gpu_check_dry_run_renders_every_example_in_bf16_and_plans_the_llama_model(tmp_path):
    proc = subprocess.run([str(GPU_CHECK), "--dry-run"], env=no_gpu_env(tmp_path, nvidia_smi=False),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = (tmp_path / "out" / "gpu-check.txt").read_text().splitlines()
    examples = sorted(p.stem for p in (REPO / "examples").glob("*.yaml"))
    assert [line.split()[0] for line in lines if "-render" in line] == [f"{e}-render" for e in examples]
    assert all("PASS  renders precision bf16" in line for line in lines if "-render" in line)
    planned = [line for line in lines if line.startswith("llama-ac-")]
    assert [line.split()[:2] for line in planned] == [["llama-ac-none", "DRY"], ["llama-ac-full", "DRY"]]
    assert all("measured peak - GB" in line and " overhead)" in line for line in planned)


def test_gpu_check_refuses_an_unknown_argument(tmp_path):
    proc = subprocess.run([str(GPU_CHECK), "--fast"], capture_output=True, text=True, timeout=30,
                          env=no_gpu_env(tmp_path, nvidia_smi=False))
    assert proc.returncode == 2 and "unknown argument --fast" in proc.stderr


def test_gpu_check_memory_without_a_gpu_exits_2_with_a_reason():
    proc = subprocess.run([sys.executable, str(MEMORY)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO)))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "no CUDA GPU" in proc.stderr and "--dry-run" in proc.stderr and "Traceback" not in proc.stderr


def test_the_llama_model_has_the_parameters_the_planner_is_told():
    torch = pytest.importorskip("torch")
    gcm = memory_module()
    shape = gcm.Shape(layers=2, hidden=64, heads=4, seq=16, micro=2, vocab=96)
    model = gcm.build(shape, torch)
    assert sum(p.numel() for p in model.parameters()) == shape.params
    assert shape.largest_layer == max(m.weight.numel() for m in model.modules() if hasattr(m, "weight"))
    ids = torch.randint(0, shape.vocab, (shape.micro, shape.seq))
    for checkpointing in (False, True):
        logits = model(ids, checkpointing)
        assert logits.shape == (shape.micro, shape.seq, shape.vocab)
        logits.float().sum().backward()
    overrides = gcm.plan_overrides(shape, "full", "bf16")
    assert "model.activation_checkpointing=full" in overrides and "model.flash_attention=true" in overrides
    assert f"model.params={shape.params}" in overrides


def test_the_memory_line_for_each_case():
    gcm = memory_module()
    shape = gcm.Shape()
    plan = {"estimate_gb": 2.0, "activations_gb": 1.0, "total_gb": 5.0}
    ok, line = gcm.verdict("none", shape, "bf16", plan, 2.4)
    assert ok and line.startswith("llama-ac-none  PASS") and "measured peak 2.400 GB allocated; planner 5.000 GB" \
        in line and "measured/planned 0.48 (without overhead 0.80)" in line
    ok, line = gcm.verdict("full", shape, "bf16", plan, 6.0)
    assert ok and "!! over the planner's total" in line
    ok, line = gcm.verdict("full", shape, "bf16", "glaunch plan exit 2: bad", 3.0)
    assert not ok and line.endswith("-- glaunch plan exit 2: bad")
    ok, line = gcm.verdict("none", shape, "bf16", plan, None, error="training failed: OutOfMemoryError: x")
    assert not ok and "FAIL" in line and line.endswith("-- training failed: OutOfMemoryError: x")
