"""Bad input resolution refuses: a loaded experiment that the site cannot run as asked
(time limits, nodes, GPUs, memory, CPUs, partitions), a strategy and its DeepSpeed block
that do not agree, counts beyond what PyTorch, Slurm or exec() hold, paths that cannot be
written as asked, plan's model sizes, a sweep's axes. Each row: the input and the
fragments its one error line must hold (tests/badinput.py says what else is checked)."""

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from badinput import (EXP, ONE_PARTITION_SITE, QUIET_EXP, SITE, Link, Refused, RefusedCall, refuse, refuse_call,
                      run_cli, table, write_files)
from launcher import api
from launcher.config import slurmtime
from launcher.resolution.strategy import inspect_factory
from launcher.schedulers.slurm.script import slurm_mem


def exp(extra: str = "", base: str = EXP) -> str:
    return base + extra


DS = "strategy: {name: deepspeed, zero_stage: 2}\nbatch: {micro_size: 2}\n"
PYXIS = "container: {runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.09-py3', mounts: [%s]}\n"
# No partition limits: what bounds a count is what consumes it.
UNBOUNDED_SITE = "name: mysite\nscheduler: slurm\npartitions:\n  gpu: {gpus_per_node: 8}\n"
ONE_PARTITION = {"site_configs/mysite.yaml": ONE_PARTITION_SITE}
# A Slurm site that lists no partitions: whatever resources.partition names is asked for.
UNLISTED_SITE = "name: mysite\nscheduler: slurm\n"


def deepspeed_block(block: str) -> dict[str, str]:
    return {"exp.yaml": EXP + DS + f"deepspeed: {block}\n", **ONE_PARTITION}


CASES = [
    # --- time limits ---
    Refused("bad-time", {"exp.yaml": EXP.replace('"01:00:00"', '"1 hour"')}, [], ["exp.yaml", "resources.time"]),
    Refused("bad-time-zero", {"exp.yaml": EXP.replace('"01:00:00"', '"0"')}, [], ["exp.yaml", "resources.time"]),
    Refused("bad-time-colons", {"exp.yaml": EXP.replace('"01:00:00"', '"1:2:3:4"')}, [], ["exp.yaml", "resources.time"]),
    Refused("time-61-minutes", {"exp.yaml": EXP.replace('"01:00:00"', '"01:61:00"')}, [],
            ["exp.yaml", "resources.time", "minutes must be at most 59"]),
    Refused("time-61-seconds", {"exp.yaml": EXP.replace('"01:00:00"', '"10:61"')}, [],
            ["exp.yaml", "resources.time", "seconds must be at most 59"]),
    Refused("time-25-hours-after-days", {"exp.yaml": EXP.replace('"01:00:00"', '"0-25:00:00"')}, [],
            ["exp.yaml", "resources.time", "hours must be at most 23"]),
    Refused("override-bad-time", {"exp.yaml": EXP}, ["resources.time=soon"], ["command line", "resources.time"]),
    Refused("time-over-max", {"exp.yaml": EXP.replace('"01:00:00"', '"2-00:00:00"')}, [],
            ["exp.yaml", "resources.time", "1-00:00:00", "max_time"]),
    Refused("lead-over-time", {"exp.yaml": exp("requeue: {signal_lead_s: 3600}\n")}, [],
            ["exp.yaml", "requeue.signal_lead_s"]),
    # --- what the site's partitions hold ---
    Refused("too-many-gpus", {"exp.yaml": exp("", EXP.replace("nodes: 2,", "nodes: 2, gpus_per_node: 9,"))}, [],
            ["exp.yaml", "resources.gpus_per_node", "9", "has 4", "partitions.gpu.gpus_per_node"]),
    Refused("too-many-nodes", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 9")}, [],
            ["exp.yaml", "resources.nodes", "at most 8"]),
    Refused("zero-nodes", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 0")}, [], ["exp.yaml", "resources.nodes"]),
    Refused("local-two-nodes", {"exp.yaml": EXP}, ["--site", "local"], ["exp.yaml", "resources.nodes"]),
    Refused("too-much-mem", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, mem_gb: 1000,")}, [],
            ["exp.yaml", "resources.mem_gb", "256"]),
    Refused("too-many-cpus", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, cpus_per_task: 16,")}, [],
            ["exp.yaml", "resources.cpus_per_task", "32"]),
    # A partition no site lists still becomes an #SBATCH line: its name is checked as a profile's are.
    *[Refused(f"partition-name-{name}", {"exp.yaml": QUIET_EXP, "site_configs/mysite.yaml": UNLISTED_SITE},
              [f"resources.partition={partition}", "resources.gpus_per_node=1"],
              ["command line: resources.partition", "partition name"])
      for name, partition in [("newline", "a\nb"), ("escape", "a\x1bb"), ("space", "a b"), ("dash", "-x"),
                              ("quote", 'a"b')]],
    Refused("partition-name-newline-listed", {"exp.yaml": QUIET_EXP}, ["resources.partition=a\nb"],
            ["command line: resources.partition", "partition name"]),
    Refused("unknown-partition", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, partition: nosuch,")}, [],
            ["exp.yaml", "resources.partition", "nosuch"]),
    *[Refused(f"mem-below-one-mib-{mem}", ONE_PARTITION, [f"resources.mem_gb={mem}"], ["resources.mem_gb", "1 MiB"])
      for mem in ["0.0001", "0.0009", "1e-300"]],
    # --- counts beyond what the job's consumers hold ---
    *[Refused(f"count-{key}-{name}", {"exp.yaml": QUIET_EXP, "site_configs/mysite.yaml": UNBOUNDED_SITE}, [override],
              [f"command line: {key}", fragment])
      for name, override, key, fragment in [
          ("ranks", "resources.nodes=131073", "resources.nodes", "1048584 ranks, more than glaunch runs in one job"),
          ("int64", "resources.nodes=9223372036854775807", "resources.nodes", "more than glaunch runs in one job"),
          ("slurm", "resources.cpus_per_task=65534", "resources.cpus_per_task", "more than Slurm can request (65533)"),
          ("slurm", "resources.mem_gb=1e300", "resources.mem_gb", "more than Slurm can request"),
          ("int64", "batch.micro_size=9223372036854775807", "batch.micro_size", "more than a 64-bit count holds")]],
    # --- what exec() cannot start ---
    Refused("exec-env-value", {"exp.yaml": QUIET_EXP + "env: {A: '%s'}\n" % ("x" * 131070)}, [],
            ["exp.yaml:5: env.A", "131072 bytes long"]),
    # Aliases make a small file a large environment.
    Refused("exec-env-total", {"exp.yaml": QUIET_EXP + "env: {V0: &v '%s', %s}\n"
                                           % ("x" * 100000, ", ".join(f"V{i}: *v" for i in range(1, 11)))}, [],
            ["env.V10", "ARG_MAX"]),
    Refused("exec-torchrun-arg", {"exp.yaml": QUIET_EXP.replace("entrypoint: {script: train.py}\n", "")
                                  + "launcher: torchrun\nentrypoint: {script: train.py, args: ['%s']}\n"
                                  % ("y" * 131072)}, [],
            ["entrypoint.args[0]", "131072 bytes long"]),
    Refused("exec-site-env", {"exp.yaml": QUIET_EXP, "site_configs/mysite.yaml": SITE + "env: {BIG: '%s'}\n"
                                                                                  % ("z" * 140000)}, [],
            ["mysite.yaml:7: env.BIG", "MAX_ARG_STRLEN"]),
    # --- the watchdog, requeue and checkpoints ---
    Refused("negative-stall", {"exp.yaml": exp("watchdog: {stall_s: -1}\n")}, [], ["exp.yaml", "watchdog.stall_s", "0 (off)"]),
    Refused("negative-first-step", {"exp.yaml": exp("watchdog: {first_step_s: -5}\n")}, [],
            ["exp.yaml", "watchdog.first_step_s"]),
    Refused("negative-requeue", {"exp.yaml": exp("requeue: {max: -1}\n")}, [], ["exp.yaml", "requeue.max"]),
    Refused("every-steps-zero", {"exp.yaml": exp("checkpoint: {every_steps: 0}\n")}, [], ["exp.yaml",
                                                                                         "checkpoint.every_steps"]),
    # --- paths ---
    Refused("unset-var-in-checkpoint-dir", {"exp.yaml": exp("checkpoint: {dir: /x/$GLAUNCH_TEST_UNSET/c}\n")}, [],
            ["exp.yaml", "checkpoint.dir", "GLAUNCH_TEST_UNSET"]),
    Refused("tilde-user", ONE_PARTITION, ["checkpoint.dir=~bob/ck"], ["checkpoint.dir", "~bob", "full path"]),
    Refused("tilde-without-home", ONE_PARTITION, ["checkpoint.dir=~/ck"], ["checkpoint.dir", "HOME"], unset=["HOME"]),
    Refused("empty-runs-dir", {"exp.yaml": QUIET_EXP}, ["--runs-dir", ""], ["--runs-dir", "empty"]),
    # Directories glaunch writes into, on a pseudo-file system (the path resolved first): nothing is stored there.
    *[Refused(f"pseudo-fs-{name}", {"exp.yaml": QUIET_EXP, "to-proc": Link("/proc"), "to-dev": Link("/dev")}, args,
              [f"{where}: ", "pseudo-file system"])
      for name, args, where in [
          ("checkpoint-dir-proc", ["checkpoint.dir=/proc/ckpt"], "command line: checkpoint.dir"),
          ("checkpoint-dir-sys", ["checkpoint.dir=/sys/ckpt"], "command line: checkpoint.dir"),
          ("checkpoint-dir-dev", ["checkpoint.dir=/dev/ckpt"], "command line: checkpoint.dir"),
          ("checkpoint-dir-proc-itself", ["checkpoint.dir=/proc"], "command line: checkpoint.dir"),
          ("checkpoint-dir-dotdot", ["checkpoint.dir=/tmp/../proc/self/ckpt"], "command line: checkpoint.dir"),
          ("checkpoint-dir-symlink", ["checkpoint.dir=to-proc/ckpt"], "command line: checkpoint.dir"),
          ("checkpoint-dir-symlink-dev", ["checkpoint.dir=to-dev/x"], "command line: checkpoint.dir"),
          ("runs-dir-proc", ["--runs-dir", "/proc/runs"], "command line: --runs-dir"),
          ("runs-dir-symlink", ["--runs-dir", "to-proc/runs"], "command line: --runs-dir"),
          ("nvme-path-dev", ["strategy.name=deepspeed", "strategy.zero_stage=3", "strategy.offload_optimizer=nvme",
                             "strategy.nvme_path=/dev/nvme0n1"], "command line: strategy.nvme_path")]],
    Refused("pseudo-fs-runs-root", {"exp.yaml": QUIET_EXP, "site_configs/mysite.yaml": SITE + "runs_root: /sys/runs\n"},
            ["submit", "exp.yaml", "--site", "mysite", "--dry-run"], ["mysite.yaml:7: runs_root", "pseudo-file system"],
            command=None),
    # --- strategies and the DeepSpeed block, checked once merged ---
    Refused("bad-zero-stage", {"exp.yaml": exp("strategy: {name: deepspeed, zero_stage: 5}\n")}, [],
            ["exp.yaml", "strategy.zero_stage"]),
    Refused("offload-without-deepspeed", {"exp.yaml": exp("strategy: {name: ddp, offload_optimizer: cpu}\n")}, [],
            ["exp.yaml", "strategy.offload_optimizer"]),
    Refused("param-offload-stage2", {"exp.yaml": exp("strategy: {name: deepspeed, zero_stage: 2, offload_params: cpu}\n")},
            [], ["exp.yaml", "strategy.offload_params", "stage 3"]),
    Refused("nvme-without-path", {"exp.yaml": exp("strategy: {name: deepspeed, zero_stage: 3, offload_optimizer: nvme}\n")},
            [], ["exp.yaml", "strategy.nvme_path"]),
    Refused("indivisible-batch", {"exp.yaml": exp("strategy: {name: deepspeed}\nbatch: {global_size: 100, micro_size: 8}\n")},
            [], ["exp.yaml", "batch.global_size", "100"]),
    Refused("ds-batch-mismatch", {"exp.yaml": exp("strategy: {name: deepspeed}\nbatch: {micro_size: 2}\n"
                                                  "deepspeed: {train_batch_size: 7}\n")}, [],
            ["exp.yaml", "deepspeed.train_batch_size"]),
    Refused("deepspeed-keys-with-ddp", {"exp.yaml": exp("deepspeed: {gradient_clipping: 1.0}\n")}, [],
            ["exp.yaml", "deepspeed", "ddp"]),
    Refused("fsdp-offload-params", {"exp.yaml": exp("strategy: {name: fsdp, offload_params: cpu}\n")}, [],
            ["exp.yaml", "strategy.offload_params", "fsdp", "CPUOffloadPolicy", "strategy.name: deepspeed"]),
    Refused("fsdp-offload-optimizer", {"exp.yaml": exp("strategy: {name: fsdp, offload_optimizer: cpu}\n")}, [],
            ["exp.yaml", "strategy.offload_optimizer", "fsdp"]),
    Refused("fsdp-override-offload", {"exp.yaml": exp("strategy: {name: fsdp}\n")}, ["strategy.offload_params=nvme"],
            ["command line", "strategy.offload_params", "fsdp"]),
    Refused("fsdp-deepspeed-keys", {"exp.yaml": exp("strategy: {name: fsdp}\ndeepspeed: {gradient_clipping: 1.0}\n")}, [],
            ["exp.yaml", "deepspeed", "strategy.name is 'fsdp'"]),
    *[Refused(f"deepspeed-block-{key.removeprefix('deepspeed.')}{suffix}", deepspeed_block(block), [],
              ["exp.yaml", key])
      for block, key, suffix in [
          ("{zero_optimization: {stage: 7}}", "deepspeed.zero_optimization.stage", "-7"),
          ("{zero_optimization: {stage: true}}", "deepspeed.zero_optimization.stage", "-true"),
          ("{zero_optimization: {stage: 3}}", "deepspeed.zero_optimization.stage", "-3"),     # strategy says 2
          ("{zero_optimization: 3}", "deepspeed.zero_optimization", ""),
          ("{zero_optimization: {offload_optimizer: {device: gpu}}}",
           "deepspeed.zero_optimization.offload_optimizer.device", ""),
          ("{zero_optimization: {offload_optimizer: {device: nvme}}}",
           "deepspeed.zero_optimization.offload_optimizer.nvme_path", ""),
          ("{zero_optimization: {offload_param: {device: cpu}}}", "deepspeed.zero_optimization.offload_param.device",
           ""),
          ("{zero_optimization: {offload_optimizer: cpu}}", "deepspeed.zero_optimization.offload_optimizer", ""),
          ("{fp16: {enabled: true}, bf16: {enabled: true}}", "deepspeed.fp16.enabled", "-with-bf16"),
          ("{bf16: {enabled: true}}", "deepspeed.bf16.enabled", "-fp32"),                # precision is fp32
          ("{fp16: {enabled: 'yes'}}", "deepspeed.fp16.enabled", "-yes"),
          ("{fp16: true}", "deepspeed.fp16", ""),
          ("{train_batch_size: 7}", "deepspeed.train_batch_size", ""),
          ("{train_micro_batch_size_per_gpu: 0}", "deepspeed.train_micro_batch_size_per_gpu", "")]],
    Refused("deepspeed-block-bf16.enabled-false", deepspeed_block("{bf16: {enabled: false}}"), ["precision=bf16"],
            ["deepspeed.bf16.enabled"]),
    # --- plan: the model and the GPUs it is planned on ---
    Refused("plan-params-fraction", {"exp.yaml": EXP + "model: {params: 0.5}\n", **ONE_PARTITION}, ["--json"],
            ["model.params"], command="plan"),
    *[Refused(f"plan-gpus-per-node-{gpus}", {"exp.yaml": QUIET_EXP + "model: {params: 7e9}\n"},
              [f"resources.gpus_per_node={gpus}"], fragments, command="plan")
      for gpus, fragments in [
          ("0", ["command line: resources.gpus_per_node", "got 0"]),
          ("-1", ["command line: resources.gpus_per_node", "got -1"]),
          ("9", ["command line: resources.gpus_per_node", "partition 'gpu'", "has 4"])]],
    # The site's partition has no GPUs: the profile is to blame, not the experiment.
    Refused("plan-partition-without-gpus", {"exp.yaml": QUIET_EXP + "model: {params: 7e9}\n"},
            ["resources.partition=cpu"], ["mysite.yaml:6: partitions.cpu.gpus_per_node"], command="plan"),
]


def dry_run(**kwargs):
    return api.submit("exp.yaml", dry_run=True, runs_dir="runs", **kwargs)


CALLS = [
    *[RefusedCall(f"zero-stage-{stage}-with-{strategy}",
                  lambda strategy=strategy, stage=stage: dry_run(site="mysite", overrides=[
                      f"strategy.name={strategy}", f"strategy.zero_stage={stage}"]),
                  "strategy.zero_stage", check=lambda error: "0..3" in error.message)
      for stage in [4, -1] for strategy in ["ddp", "fsdp", "deepspeed"]],
    RefusedCall("sweep-axis-of-another-type", lambda: api.prepare_sweep("exp.yaml", [5], site="mysite", dry_run=True),
                None, ["is not KEY=V1,V2,... text, it is int"]),
]


@table(CASES)
def test_refused(case, tmp_path, monkeypatch, capsys, isolated_env):
    refuse(case, tmp_path, monkeypatch, capsys)


@table(CALLS)
def test_refused_call(case, mysite_workdir):
    refuse_call(case, mysite_workdir)


def test_time_beyond_slurms_range_is_refused(tmp_path, monkeypatch, capsys, isolated_env):
    refuse(Refused("time-beyond-slurm", {"exp.yaml": QUIET_EXP, "site_configs/mysite.yaml":
                                         SITE.replace(', max_time: "1-00:00:00"', "")},
                   ["resources.time=99999999-00:00:00"],
                   ["command line: resources.time", "longer than any time limit Slurm can hold"]),
           tmp_path, monkeypatch, capsys)
    longest = slurmtime.MAX_MINUTES // 1440           # whole days
    assert slurmtime.parse(f"{longest}-00:00:00") == longest * 86400
    with pytest.raises(ValueError, match="Slurm can hold"):
        slurmtime.parse(f"{longest + 1}-00:00:00")


@pytest.mark.parametrize("where,args", [
    ("working directory", []), ("--runs-dir", ["--runs-dir", "RUNS"]), ("checkpoint.dir", ["checkpoint.dir=CK"]),
])
@pytest.mark.parametrize("bad", [",", ":"])
def test_paths_that_become_mounts_may_not_hold_separators(where, args, bad, tmp_path, monkeypatch, capsys,
                                                          isolated_env):
    work = tmp_path / (f"w{bad}d" if where == "working directory" else "w")
    work.mkdir()
    (work / "train.py").write_text("")
    (work / "exp.yaml").write_text(EXP)
    (work / "site.yaml").write_text(ONE_PARTITION_SITE + PYXIS % "/data")
    monkeypatch.chdir(work)
    args = [a.replace("RUNS", str(tmp_path / f"r{bad}s")).replace("CK", f"/ck{bad}x") for a in args]
    runs = [] if "--runs-dir" in args else ["--runs-dir", str(tmp_path / "runs")]
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "./site.yaml",
                                                   "--dry-run", *runs, *args])
    assert code == 2, out
    assert where in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_model_factory_without_torch_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)      # as if torch were not installed
    monkeypatch.setitem(sys.modules, "fake_models", type(sys)("fake_models"))
    sys.modules["fake_models"].build = lambda: None
    with pytest.raises(ValueError, match="needs torch installed"):
        inspect_factory("fake_models:build")


# --- what the checks let through, as it is rendered -------------------------------------------

def accepted(root, monkeypatch, capsys, *args, exp_extra="") -> dict[str, str]:
    """The bundle's files of `glaunch submit exp.yaml --site mysite --dry-run --json`, run in
    `root` on EXP + exp_extra and ONE_PARTITION_SITE: it must pass."""
    monkeypatch.chdir(root)
    write_files(root, {"train.py": "", "exp.yaml": EXP + exp_extra, "site_configs/mysite.yaml": ONE_PARTITION_SITE})
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "mysite", "--dry-run",
                                                   "--json", "--runs-dir", str(root / "runs"), *args])
    assert code == 0, err
    run_dir = Path(json.loads(out)["run_dir"])
    return {p.name: p.read_text() for p in run_dir.iterdir() if p.is_file()}


@pytest.mark.parametrize("mem,expected", [(100, "100G"), (0.5, "512M"), (1.3, "1332M"), (0.001, "2M"),
                                          (1 / 1024, "1M")])
def test_slurm_mem_never_rounds_below_the_request_or_to_zero(mem, expected):
    assert slurm_mem(mem) == expected


def test_small_memory_is_rendered_in_mib(tmp_path, monkeypatch, capsys, isolated_env):
    assert "#SBATCH --mem=256M\n" in accepted(tmp_path, monkeypatch, capsys, "resources.mem_gb=0.25")["job.sbatch"]


@pytest.mark.parametrize("path,expected", [("~/", ""), ("~/ck", "/ck"), ("~//ck/..", "")])
def test_tilde_and_tilde_slash_are_home(path, expected, tmp_path, monkeypatch, capsys, isolated_env):
    env_sh = accepted(tmp_path, monkeypatch, capsys, f"checkpoint.dir={path}")["env.sh"]
    home = str(tmp_path / "home")
    assert f"export GLAUNCH_CHECKPOINT_DIR={home}{expected}\n" in env_sh


def test_double_dollar_in_a_path_is_a_dollar(tmp_path, monkeypatch, capsys, isolated_env):
    env_sh = accepted(tmp_path, monkeypatch, capsys, "checkpoint.dir=/ck/$$HOME")["env.sh"]
    assert "export GLAUNCH_CHECKPOINT_DIR='/ck/$HOME'\n" in env_sh


def test_consistent_deepspeed_block_is_merged(tmp_path, monkeypatch, capsys, isolated_env):
    files = accepted(tmp_path, monkeypatch, capsys, "precision=bf16", exp_extra=DS + (
        "deepspeed: {gradient_clipping: 1.0, zero_optimization: {stage: 2, overlap_comm: true, "
        "offload_optimizer: {device: cpu}}, bf16: {enabled: true}}\n"))
    ds = json.loads(files["ds_config.json"])
    assert ds["gradient_clipping"] == 1.0 and ds["zero_optimization"]["overlap_comm"] is True
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_zero_stage_in_range_with_ddp_is_taken(mysite_workdir):
    assert dry_run(site="mysite", overrides=["strategy.name=ddp", "strategy.zero_stage=3"]).state == "RENDERED"


def test_largest_world_size_renders(mysite_workdir):
    (mysite_workdir / "site_configs" / "mysite.yaml").write_text(UNBOUNDED_SITE)
    prepared = api.prepare("exp.yaml", site="mysite", overrides=["resources.nodes=131072"], dry_run=True)
    assert prepared.plan.launch.world_size == 2 ** 20
    assert "#SBATCH --nodes=131072" in prepared.files["job.sbatch"]


def test_the_exec_string_bound_is_the_kernels():
    """A program starts with an environment string of MAX_EXEC_STRING bytes, not one more."""
    from launcher.resolution.resolve import MAX_EXEC_STRING

    def starts(size):
        env = {"PATH": "/usr/bin:/bin", "A": "x" * (size - len("A="))}
        try:
            return subprocess.run(["/bin/true"], env=env, timeout=60).returncode == 0
        except OSError as exc:
            assert exc.errno == errno.E2BIG, exc
            return False
    assert starts(MAX_EXEC_STRING)
    assert not starts(MAX_EXEC_STRING + 1)


def test_long_arguments_are_fine_under_srun(mysite_workdir):
    """Under srun the script runs in the task's own process: its arguments are never exec'd."""
    (mysite_workdir / "exp.yaml").write_text(QUIET_EXP.replace("{script: train.py}", "{script: train.py, args: ['%s']}"
                                                               % ("y" * 200000)))
    prepared = api.prepare("exp.yaml", site="mysite", dry_run=True)
    assert prepared.plan.launch.entry_args == ("y" * 200000,)
