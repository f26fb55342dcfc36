"""Every generated ds_config.json passes DeepSpeed's own parser at the run's world size."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CASES = [
    ("examples/deepspeed_zero2.yaml", []),
    ("examples/deepspeed_zero3.yaml", []),
    ("examples/deepspeed_zero2.yaml", ["precision=bf16", "batch.global_size=64", "batch.micro_size=4"]),
    ("examples/deepspeed_zero2.yaml", ["precision=fp16", "strategy.zero_stage=1"]),
    ("examples/deepspeed_zero3.yaml", ["strategy.offload_params=cpu", "deepspeed={gradient_clipping: 1.0}"]),
    # A raw block that passes glaunch's checks after merging is one DeepSpeed takes too.
    ("examples/deepspeed_zero2.yaml", ["precision=bf16", "deepspeed={bf16: {enabled: true}, zero_optimization: "
                                      "{stage: 2, overlap_comm: true, offload_optimizer: {device: cpu}}}"]),
]


@pytest.fixture(scope="module")
def deepspeed_parser():
    """DeepSpeed's config parser in one interpreter for the module's cases (importing
    DeepSpeed costs seconds of CPU): parse(config, world) -> its reading, or the error it raised."""
    pytest.importorskip("deepspeed")
    server = subprocess.Popen([sys.executable, "-c", PARSER, ANSWER], env=dict(os.environ, DS_ACCELERATOR="cpu"),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def parse(config: dict, world: int) -> dict:
        server.stdin.write(json.dumps({"config": config, "world": world}) + "\n")
        server.stdin.flush()
        # DeepSpeed logs to stdout too: the answer is the line with the marker.
        for line in server.stdout:
            if line.startswith(ANSWER):
                return json.loads(line[len(ANSWER):])
        raise AssertionError(f"DeepSpeed's parser ended (exit {server.wait(timeout=60)})")

    yield parse
    server.stdin.close()
    server.wait(timeout=60)


@pytest.mark.parametrize("experiment,overrides", CASES)
def test_deepspeed_parses_generated_config(experiment, overrides, tmp_path, isolated_env, deepspeed_parser):
    runs = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", experiment, "--dry-run", "--json",
                           "--runs-dir", str(runs), *overrides], cwd=REPO, env=isolated_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    config = json.loads((run_dir / "ds_config.json").read_text())
    world = int(_resolved_world(run_dir))
    parsed = deepspeed_parser(config, world)
    assert "error" not in parsed, parsed.get("error")
    assert parsed["train_batch_size"] == config["train_batch_size"]
    assert parsed["gradient_accumulation_steps"] * parsed["micro"] * world == config["train_batch_size"]
    assert parsed["zero_stage"] == config["zero_optimization"]["stage"]


def _resolved_world(run_dir):
    import yaml
    return yaml.safe_load((run_dir / "resolved.yaml").read_text())["derived"]["world_size"]


ANSWER = "deepspeed-config-reading: "
# Reads {"config", "world"} lines; answers each with the marker (its argument) and what DeepSpeedConfig made
# of it, or the error it raised.
PARSER = r"""
import json, sys, traceback
import deepspeed.runtime.config as ds_config_module
from deepspeed.runtime.config import DeepSpeedConfig
# The parser asks for this process's rank before it uses the mpu's world size; with no
# process group that query raises and the parser falls back to world size 1.
ds_config_module.dist.get_rank = lambda *args, **kwargs: 0
class DataParallel:
    def __init__(self, n): self.n = n
    def get_data_parallel_world_size(self): return self.n
    def get_sequence_parallel_world_size(self): return 1
    def get_model_parallel_world_size(self): return 1
for line in sys.stdin:
    case = json.loads(line)
    try:
        cfg = DeepSpeedConfig(case["config"], mpu=DataParallel(case["world"]))
        reading = {"train_batch_size": cfg.train_batch_size, "micro": cfg.train_micro_batch_size_per_gpu,
                   "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
                   "zero_stage": cfg.zero_optimization_stage}
    except Exception:
        reading = {"error": traceback.format_exc()[-3000:]}
    print(sys.argv[1] + json.dumps(reading), flush=True)
"""
