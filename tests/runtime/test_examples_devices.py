"""Where each example trains: GPUs (cuda:LOCAL_RANK, NCCL, the configured precision) where there
are GPUs, the CPU over gloo elsewhere; and torchrun's options chosen from the node's own torch.

This machine has no GPU: "CUDA available, N devices" is a fake (torch.cuda.is_available and
device_count patched, DeepSpeed given its CUDA accelerator object), named so below. The CPU
side runs for real here and end to end in test_local_run.py and test_local_requeue.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import signal
import types
from pathlib import Path

import pytest

from launcher import api
from launcher.rundir import launch
from launcher.rundir.layout import RunDir
from launcher.rundir.taskspec import TaskSpec, write_task_spec
from launcher.runtime import stop
from launcher.rundir.rankcontext import RuntimeConfigError
from launcher.runtime.device import gpu_index, placement

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")
GPU_SITES = ("cscs-clariden", "isambard-ai", "juwels-booster", "juwels-booster-apptainer", "leonardo-booster")
EXAMPLES = ("torch_ddp", "lightning_ddp", "deepspeed_zero2", "deepspeed_zero3", "fsdp", "lightning_fsdp",
            "lightning_deepspeed")


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for k in [*RANK_VARS, "PL_GLOBAL_SEED", *(k for k in os.environ if k.startswith(("GLAUNCH_", "SLURM_", "TORCHELASTIC")))]:
        monkeypatch.setenv(k, "")          # registered, so whatever the code under test sets is undone
        monkeypatch.delenv(k)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                                 signal.SIGQUIT)}
    yield
    stop.uninstall_stop_handler()
    stop.reset_stop()
    for s, h in handlers.items():
        signal.signal(s, h)


def rank(monkeypatch, *, local_rank=0, local_world=4, nodes=1, precision="fp32"):
    world = local_world * nodes
    for k, v in dict(RANK=local_rank, LOCAL_RANK=local_rank, WORLD_SIZE=world, LOCAL_WORLD_SIZE=local_world,
                     GROUP_RANK=0, GLAUNCH_PRECISION=precision).items():
        monkeypatch.setenv(k, str(v))


def fake_cuda(monkeypatch, devices: int, capability=(9, 0), name="NVIDIA H100 80GB HBM3") -> None:
    """Fake of what cannot run here: torch reporting `devices` CUDA GPUs of that compute capability."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name)
    monkeypatch.setattr(torch.version, "hip", None)


def fake_deepspeed_cuda(monkeypatch) -> None:
    """Fake of what cannot run here: DeepSpeed having picked its CUDA accelerator (a GPU node)."""
    from deepspeed.accelerator import real_accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    monkeypatch.setattr(real_accelerator, "ds_accelerator", CUDA_Accelerator())


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the shared decision (launcher.runtime.device) -------------------------------------------


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cpu_is_gloo_in_fp32_whatever_the_precision(monkeypatch, precision):
    rank(monkeypatch, local_rank=1, local_world=2, precision=precision)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    where = placement()
    assert (where.device, where.backend, where.precision, where.requested) == ("cpu", "gloo", "fp32", precision)
    assert where.describe_precision() == ("fp32" if precision == "fp32" else
                                          f"fp32 ({precision} configured; the CPU trains in fp32)")
    assert where.index is None and where.ddp_options() == {}
    assert where.autocast_dtype() is None
    assert not where.grad_scaler().is_enabled()
    with where.autocast():                      # a no-op context: CPU numerics stay as they are
        assert not torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("precision,dtype,scaled", [("bf16", "bfloat16", False), ("fp16", "float16", True),
                                                     ("fp32", None, False)])
def test_cuda_is_nccl_on_the_local_rank_in_the_configured_precision(monkeypatch, precision, dtype, scaled):
    rank(monkeypatch, local_rank=2, local_world=4, precision=precision)
    fake_cuda(monkeypatch, 4)
    where = placement()
    assert (where.device, where.index, where.backend, where.precision) == ("cuda:2", 2, "nccl", precision)
    assert where.ddp_options() == {"device_ids": [2], "output_device": 2}
    assert where.autocast_dtype() == (getattr(torch, dtype) if dtype else None)
    assert where.grad_scaler().is_enabled() is scaled


@pytest.mark.parametrize("capability,hip,expect", [((7, 0), None, "fp32"), ((7, 5), None, "fp32"),
                                                   ((8, 0), None, "bf16"), ((9, 0), None, "bf16"),
                                                   ((9, 0), "6.2", "bf16")])
def test_bf16_on_a_gpu_that_computes_in_it_else_fp32(monkeypatch, capability, hip, expect):
    rank(monkeypatch, precision="bf16")
    fake_cuda(monkeypatch, 4, capability, name="Tesla V100-SXM2-32GB")
    monkeypatch.setattr(torch.version, "hip", hip)
    where = placement()
    assert (where.device, where.precision, where.requested) == ("cuda:0", expect, "bf16")
    if expect == "fp32":
        assert where.describe_precision() == "fp32 (bf16 configured; Tesla V100-SXM2-32GB has no bf16 arithmetic)"
        assert where.autocast_dtype() is None


def test_gpu_index_per_task_binding_and_too_many_ranks(monkeypatch):
    assert gpu_index(3, 4) == 3
    assert gpu_index(3, 1) == 0            # the task sees only its own GPU (per-task binding)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(RuntimeConfigError, match=r"LOCAL_RANK=3.*sees 2 GPUs \(CUDA_VISIBLE_DEVICES=0,1\)"):
        gpu_index(3, 2)
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(RuntimeConfigError, match=r"DS_ACCELERATOR=cuda.*sees no GPU"):
        gpu_index(0, 0)


def test_backend_override_and_bad_precision(monkeypatch):
    rank(monkeypatch, precision="bf16")
    fake_cuda(monkeypatch, 4)
    monkeypatch.setenv("GLAUNCH_DIST_BACKEND", "gloo")
    assert placement().backend == "gloo" and placement().device == "cuda:0"
    monkeypatch.setenv("GLAUNCH_PRECISION", "half")
    with pytest.raises(RuntimeConfigError, match="GLAUNCH_PRECISION='half'"):
        placement()


# --- torch_ddp and fsdp: the examples' own start-up --------------------------------------


class Joined(Exception):
    pass


@pytest.mark.parametrize("example", ["torch_ddp", "fsdp"])
@pytest.mark.parametrize("cuda", [True, False])
def test_torch_examples_join_nccl_on_their_gpu_or_gloo_on_cpu(monkeypatch, tmp_path, cuda, example):
    """Runs the example's main up to init_process_group and records what it asked for."""
    rank(monkeypatch, local_rank=1, local_world=2, precision="bf16")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29999")
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path))
    seen = {}
    if cuda:
        fake_cuda(monkeypatch, 2)
        # Fake of what cannot run here: selecting a CUDA device.
        monkeypatch.setattr(torch.cuda, "set_device", lambda index: seen.setdefault("device", index))
    else:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def init_process_group(backend, **kwargs):   # stop before any collective
        seen["backend"] = backend
        raise Joined

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    with pytest.raises(Joined):
        load_example(example).main(["--steps", "1"])
    assert seen == ({"device": 1, "backend": "nccl"} if cuda else {"backend": "gloo"})


# --- lightning_ddp: the Trainer the example builds ---------------------------------------------


class Built(Exception):
    pass


@pytest.mark.parametrize("cuda,precision,expect", [
    (True, "bf16", ("gpu", "nccl", "bf16-mixed")),
    (True, "fp16", ("gpu", "nccl", "16-mixed")),
    (True, "fp32", ("gpu", "nccl", "32-true")),
    (False, "bf16", ("cpu", "gloo", "32-true")),         # the CPU trains in fp32, as every example there
    (False, "fp16", ("cpu", "gloo", "32-true")),
])
def test_lightning_example_trainer_from_the_runtime(monkeypatch, tmp_path, cuda, precision, expect):
    pytest.importorskip("lightning")
    import lightning as L

    rank(monkeypatch, local_rank=1, local_world=4, nodes=2, precision=precision)
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path))
    if cuda:
        fake_cuda(monkeypatch, 4)
    else:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    built = {}

    def trainer(**kwargs):    # a Trainer on GPUs cannot be built here: record what it would get
        built.update(kwargs)
        raise Built

    monkeypatch.setattr(L, "Trainer", trainer)
    example = load_example("lightning_ddp")
    with pytest.raises(Built):
        example.main(["--steps", "1"])
    assert (built["accelerator"], built["strategy"].process_group_backend, built["precision"]) == expect
    assert (built["devices"], built["num_nodes"]) == (4, 2)


# --- DeepSpeed: accelerator, backend, precision and optimizer ----------------------------------


def test_deepspeed_on_a_gpu_node_uses_cuda_nccl_and_keeps_fp16(monkeypatch, tmp_path):
    pytest.importorskip("deepspeed")
    from launcher.runtime import deepspeed as gds

    rank(monkeypatch, local_rank=3, local_world=4, precision="fp16")
    fake_cuda(monkeypatch, 4)
    fake_deepspeed_cuda(monkeypatch)
    where = gds.placement()
    assert (where.device, where.backend) == ("cuda:3", "nccl")
    config = {"train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": True}}
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(json.dumps(config))
    monkeypatch.setenv("GLAUNCH_DS_CONFIG", str(cfg))
    assert gds.ds_config({})["fp16"] == {"enabled": True}


def test_deepspeed_on_a_gpu_node_keeps_bf16_where_the_gpu_has_it(monkeypatch, tmp_path, capfd):
    pytest.importorskip("deepspeed")
    from launcher.runtime import deepspeed as gds

    rank(monkeypatch, local_rank=0, local_world=4, precision="bf16")
    fake_cuda(monkeypatch, 4)
    fake_deepspeed_cuda(monkeypatch)
    assert gds.ds_config({"bf16": {"enabled": True}})["bf16"] == {"enabled": True}
    fake_cuda(monkeypatch, 4, (7, 0), name="Tesla V100-SXM2-32GB")
    assert gds.ds_config({"bf16": {"enabled": True}})["bf16"] == {"enabled": False}
    assert "enables bf16; training in fp32 (bf16 configured; Tesla V100-SXM2-32GB has no bf16" in capfd.readouterr().err


def test_deepspeed_on_cpu_turns_fp16_and_bf16_off(monkeypatch, tmp_path, capfd):
    pytest.importorskip("deepspeed")
    from launcher.runtime import deepspeed as gds

    rank(monkeypatch, local_rank=0, local_world=2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    where = gds.placement()
    assert (where.device, where.backend) == ("cpu", "gloo")
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    default = {"fp16": {"enabled": True, "loss_scale": 0}}
    assert gds.ds_config(default)["fp16"] == {"enabled": False, "loss_scale": 0}
    assert default["fp16"]["enabled"] is True                  # the caller's dict is left alone
    assert "enables fp16; training in fp32 (fp16 configured; the CPU trains in fp32)" in capfd.readouterr().err
    assert gds.ds_config({"bf16": {"enabled": True}})["bf16"] == {"enabled": False}
    assert "enables bf16; training in fp32 (bf16 configured; the CPU trains in fp32)" in capfd.readouterr().err


def test_deepspeed_cpu_accelerator_on_a_gpu_node_stays_coherent(monkeypatch, capfd):
    """DS_ACCELERATOR=cpu in the environment of a node with GPUs (a CPU site profile used on a GPU
    machine): DeepSpeed is on the CPU, so the process group must be gloo, and the log says why."""
    pytest.importorskip("deepspeed")
    from launcher.runtime import deepspeed as gds

    rank(monkeypatch, local_rank=0, local_world=1)
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    fake_cuda(monkeypatch, 1)
    where = gds.placement()
    assert (where.device, where.backend) == ("cpu", "gloo")
    assert "DS_ACCELERATOR=cpu: DeepSpeed trains on the CPU" in capfd.readouterr().err


@pytest.mark.parametrize("offload", [None, "cpu"])
def test_deepspeed_optimizer_choice(monkeypatch, offload):
    pytest.importorskip("deepspeed")
    from torch.utils import cpp_extension

    example = load_example("deepspeed_zero2")
    config = {"zero_optimization": {"stage": 3, "offload_optimizer": {"device": offload} if offload else None}}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert example.optimizer_block(config)["params"]["torch_adam"] is True      # CPU: as always
    fake_cuda(monkeypatch, 1)
    fake_deepspeed_cuda(monkeypatch)
    # Facts of a GPU machine, faked: ninja, nvcc (CUDA_HOME), a C++ compiler.
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: True)
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", "/usr/local/cuda")
    monkeypatch.setattr("shutil.which", lambda name: f"/usr/bin/{name}")
    assert "torch_adam" not in example.optimizer_block(config)["params"]       # DeepSpeed's own Adam
    assert example.optimizer_block(config, choice="torch")["params"]["torch_adam"] is True
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr("shutil.which", lambda name: None)
    assert example.optimizer_block(config)["params"].get("torch_adam") is True  # nothing to build it with


# --- nothing CPU-only reaches a GPU site -------------------------------------------------------


def test_gpu_sites_are_every_shipped_cluster_profile():
    from launcher.config.sites import SHIPPED_SITES

    shipped = {p.stem for p in SHIPPED_SITES.glob("*.yaml")}
    assert set(GPU_SITES) == {s for s in shipped if not s.startswith(("local", "base-"))}
    assert {p.stem for p in (REPO / "examples").glob("*.yaml")} == set(EXAMPLES)


@pytest.mark.parametrize("site", GPU_SITES)
def test_gpu_sites_train_the_examples_in_bf16_and_export_nothing_cpu_only(site, tmp_path, isolated_env, monkeypatch):
    """Every example, dry-run on every GPU profile: GLAUNCH_PRECISION=bf16 in env.sh, ds_config.json's
    bf16 section on, and on such a GPU (faked: an H100) bf16 autocast, DeepSpeed's bf16 and
    Lightning's bf16-mixed."""
    pytest.importorskip("lightning")
    from launcher.runtime.lightning import trainer_precision

    fake_cuda(monkeypatch, 4)
    for example in EXAMPLES:
        run = api.submit(REPO / "examples" / f"{example}.yaml", site=site, dry_run=True,
                         runs_dir=str(tmp_path / example), check=False)
        env_sh = (Path(run.run_dir) / "env.sh").read_text()
        for word in ("DS_ACCELERATOR", "GLAUNCH_DIST_BACKEND", "CUDA_VISIBLE_DEVICES=\"\"",
                     "CUDA_VISIBLE_DEVICES=''"):
            assert word not in env_sh, f"{site} / {example}: {word} in env.sh"
        assert re.search(r"^export GLAUNCH_PRECISION='?bf16'?$", env_sh, re.M), f"{site} / {example}"
        ds_config = Path(run.run_dir) / "ds_config.json"
        if "deepspeed" in example:
            config = json.loads(ds_config.read_text())
            assert config["bf16"] == {"enabled": True} and "fp16" not in config, f"{site} / {example}"
        else:
            assert not ds_config.exists()
        rank(monkeypatch, precision="bf16")
        assert placement().autocast_dtype() is torch.bfloat16
        if example.startswith("lightning"):
            assert trainer_precision() == "bf16-mixed"


# --- torchrun's options, from the node's parser ------------------------------------------------

SPEC = TaskSpec(launcher="torchrun", script="/home/alice/train.py", module=None, args=(), nodes=2, ranks_per_node=4,
                world_size=8, run_dir="/home/alice/runs/r", run_id="r", requeue_max=0, crash_retries=0,
                exclude_bad_nodes=True, watchdog_stall_s=0.0, watchdog_first_step_s=0.0)


def old_style(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Fake of an older torch's torchrun parser, made from the installed one: underscore spellings
    only (torch 1.x) and no --signals-to-handle (before torch 2.9 the agent handled SIGTERM, SIGINT,
    SIGHUP and SIGQUIT itself, which is what the default below keeps)."""
    for action in list(parser._actions):
        if "--signals-to-handle" in action.option_strings:
            parser._remove_action(action)
            for name in action.option_strings:
                parser._option_string_actions.pop(name, None)
            continue
        underscored = [name for name in action.option_strings if "_" in name]
        if underscored:
            for name in set(action.option_strings) - set(underscored):
                parser._option_string_actions.pop(name)
            action.option_strings = underscored
    parser.set_defaults(signals_to_handle="SIGTERM,SIGINT,SIGHUP,SIGQUIT")
    return parser


def test_torchrun_options_fit_the_parser():
    from torch.distributed.run import get_args_parser

    kw = dict(node_rank="1", master_addr="n1", master_port="29500", job_id="77")
    full = launch.torchrun_args(SPEC, **kw)                  # submit-time description: everything
    assert full[-1] == "--signals-to-handle=SIGINT,SIGHUP,SIGQUIT"
    # the torch this project installs (2.13) knows every option, as written
    assert launch.torchrun_args(SPEC, **kw, accepted=launch.parser_options(get_args_parser())) == full
    old = launch.torchrun_args(SPEC, **kw, accepted=launch.parser_options(old_style(get_args_parser())))
    assert old == ["--nnodes=2", "--nproc_per_node=4", "--node_rank=1", "--rdzv_backend=static",
                   "--rdzv_endpoint=n1:29500", "--rdzv_id=77", "--max_restarts=0"]
    with pytest.raises(RuntimeError, match="no --rdzv-id option"):
        launch.torchrun_args(SPEC, **kw, accepted={"--nnodes", "--nproc-per-node", "--node-rank",
                                                   "--rdzv-backend", "--rdzv-endpoint"})


def one_worker(monkeypatch, tmp_path: Path, script: Path) -> TaskSpec:
    """A run of one node and one worker in tmp_path, its task.json written, as the agent's
    environment has it (its run directory, a rendezvous port)."""
    from launcher.rundir.rankcontext import free_port

    spec = dataclasses.replace(SPEC, nodes=1, ranks_per_node=1, world_size=1, script=str(script),
                               run_dir=str(tmp_path), run_id="r1")
    write_task_spec(tmp_path, spec)
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    return spec


def test_a_script_without_the_runtime_outlives_the_warning_under_torchrun(monkeypatch, tmp_path, capfd):
    """The time limit's warning (SIGUSR2) reaches the agent, which passes it on: a worker
    whose script knows nothing of it goes on (its default action would end it, and the
    start as a crash) and ends well. The watchdog's request for stacks, passed on the same
    way, gets the worker's stack."""
    import threading

    from launcher.runtime import task as task_module
    from launcher.runtime.task import TrainingTask

    started = tmp_path / "started"
    script = tmp_path / "worker.py"
    script.write_text(f"import pathlib, sys, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(2)\n"
                      "print('worker ended well', sys.argv[1:], flush=True)\n")
    spec = dataclasses.replace(one_worker(monkeypatch, tmp_path, script), args=("--lr=0.1",))

    ended = threading.Event()

    def warn() -> None:
        # Nothing is sent once the run has ended: this process's own handlers are back.
        while not started.exists() and not ended.wait(0.1):
            pass
        if not ended.is_set():
            os.kill(os.getpid(), signal.SIGUSR2)
        if not ended.wait(0.5):
            os.kill(os.getpid(), task_module.DUMP_SIGNAL)

    handlers = {s: signal.getsignal(s) for s in (task_module.WARNING_SIGNAL, signal.SIGTERM,
                                                 task_module.DUMP_SIGNAL)}
    threading.Thread(target=warn, daemon=True).start()
    try:
        assert TrainingTask(tmp_path)._run_torchrun(spec, types.SimpleNamespace(node=0, job_id="5")) == 0
    finally:
        ended.set()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    own_log = RunDir(tmp_path).worker_log("5", 0, 0, 0)
    assert own_log is not None and "worker ended well ['--lr=0.1']" in own_log.read_text()
    assert "worker.py" in RunDir(tmp_path).stack_dump(0).read_text()
    _, err = capfd.readouterr()
    assert "torchrun --nnodes=1 --nproc-per-node=1" in err and f"{script} --lr=0.1" in err


@pytest.mark.parametrize("signals, taken", [
    (("USR2", "TERM"), ("USR2",)),
    (("USR1", "USR2", "TERM"), ("USR2",)),          # USR1: a plain Lightning script's own
    (("SIGUSR2", "SIGTERM", "int", " HUP"), ("SIGUSR2",)),
    (("TERM",), ()),
])
def test_a_worker_takes_the_warning_and_leaves_signals_that_end_a_process(signals, taken):
    from launcher.runtime.worker import worker_stop_signals

    assert worker_stop_signals(signals) == taken


def test_task_runs_torchrun_with_the_options_the_node_knows(monkeypatch, tmp_path, capfd):
    """The node's task asks the torch it imports: with an older torchrun (faked, see old_style)
    the real agent here parses the words chosen from it and starts the worker."""
    import torch.distributed.run as run

    from launcher.runtime.task import TrainingTask

    script = tmp_path / "worker.py"
    script.write_text("import os\nprint('worker', os.environ['RANK'], os.environ['WORLD_SIZE'], flush=True)\n")
    spec = one_worker(monkeypatch, tmp_path, script)
    installed = run.get_args_parser
    monkeypatch.setattr(run, "get_args_parser", lambda: old_style(installed()))
    assert TrainingTask(tmp_path)._run_torchrun(spec, types.SimpleNamespace(node=0, job_id="5")) == 0
    out, err = capfd.readouterr()
    assert "torchrun has no --signals-to-handle" in err
    assert "torchrun --nnodes=1 --nproc_per_node=1 --node_rank=0 --rdzv_backend=static" in err
    assert "--signals-to-handle=" not in err
    own_log = RunDir(tmp_path).worker_log("5", 0, 0, 0)
    assert own_log is not None and "worker 0 1" in own_log.read_text()


def test_a_torchrun_node_stopped_by_sigterm_ends_as_stopped_not_crashed(monkeypatch, tmp_path, capfd):
    """Preemption under torchrun: SIGTERM reaches the agent, which passes it on; a script
    without a handler dies of it, and torchrun reports a ChildFailedError. The task exits
    128 + 15 as a rank SIGTERM ended would under srun, with one line of its own: no
    crash.json, no traceback, nothing that reads as a crash."""
    import threading
    import time

    from launcher.runtime import task as task_module
    from launcher.runtime.task import TrainingTask, WorkersStopped

    started = tmp_path / "started"
    script = tmp_path / "worker.py"
    script.write_text(f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)\n")
    spec = one_worker(monkeypatch, tmp_path, script)

    def preempt() -> None:
        deadline = time.time() + 60
        while not started.exists() and time.time() < deadline:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    handlers = {s: signal.getsignal(s) for s in (task_module.WARNING_SIGNAL, signal.SIGTERM,
                                                 task_module.DUMP_SIGNAL)}
    threading.Thread(target=preempt, daemon=True).start()
    try:
        with pytest.raises(WorkersStopped) as stopped:
            TrainingTask(tmp_path)._run_torchrun(spec, types.SimpleNamespace(node=0, job_id="5"))
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert stopped.value.code == 128 + signal.SIGTERM
    _, err = capfd.readouterr()
    assert "the workers ended after SIGTERM" in err
    assert "Traceback" not in err and "ChildFailedError" not in err


def test_a_worker_runs_its_script_as_python_would(tmp_path):
    """`python -m launcher.runtime.worker ARGS`: the script as `__main__`, its argv, its
    folder first on sys.path and not the working directory (as `python SCRIPT` has it),
    its exit status; the warning taken, SIGTERM left to its default."""
    import subprocess
    import sys

    folder, work = tmp_path / "project" / "scripts", tmp_path / "work"
    for made in (folder, work, tmp_path / "run"):
        made.mkdir(parents=True)
    script = folder / "train.py"
    script.write_text("import json, os, signal, sys\n"
                      "print(json.dumps([__name__, sys.argv, sys.path[0], os.getcwd() in sys.path,\n"
                      "    signal.getsignal(signal.SIGUSR2) is signal.SIG_DFL,\n"
                      "    signal.getsignal(signal.SIGTERM) is signal.SIG_DFL]))\n"
                      "os.kill(os.getpid(), signal.SIGUSR2)\n"
                      "sys.exit(3)\n")
    spec = dataclasses.replace(SPEC, nodes=1, ranks_per_node=1, world_size=1, script=str(script),
                               run_dir=str(tmp_path / "run"), run_id="r1")
    write_task_spec(tmp_path / "run", spec)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GLAUNCH_")}
    env.update(GLAUNCH_RUN_DIR=str(tmp_path / "run"), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    proc = subprocess.run([sys.executable, "-m", "launcher.runtime.worker", "--lr=0.1", "$(touch x)"], cwd=work,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout) == ["__main__", [str(script), "--lr=0.1", "$(touch x)"], str(folder),
                                       False, False, True]
    assert not (work / "x").exists()
    # Without its run's task.json it says so and starts nothing.
    env["GLAUNCH_RUN_DIR"] = str(tmp_path / "nowhere")
    proc = subprocess.run([sys.executable, "-m", "launcher.runtime.worker"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "this worker does not start" in proc.stderr and not proc.stdout
