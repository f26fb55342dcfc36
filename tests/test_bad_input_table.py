"""Bad input -> exit 2, a message naming the file and the key, no traceback, nothing written.

Each row: files to write (name -> text, or FIFO / DIRECTORY / a Link), extra CLI args, and
the fragments stderr must hold. Rows that change only the site profile are also checked
through `glaunch sites validate`: it applies exactly the checks `submit` applies.
"""

import collections
import os
import sys
import signal

import pytest

from launcher import cli

FIFO = object()          # a named pipe: reading it would block
DIRECTORY = object()
Link = collections.namedtuple("Link", "target")

SITE = """\
name: mysite
scheduler: slurm
default_partition: gpu
partitions:
  gpu: {gpus_per_node: 4, gpu_mem_gb: 80, cpus_per_node: 32, mem_gb: 256, max_nodes: 8, max_time: "1-00:00:00"}
  cpu: {gpus_per_node: 0, max_nodes: 4}
"""
EXP = """\
name: good
entrypoint: {script: train.py}
resources: {nodes: 2, time: "01:00:00"}
"""


def exp(extra: str = "", base: str = EXP) -> str:
    return base + extra


def site(extra: str = "", base: str = SITE) -> str:
    return base + extra


# (id, files, args, fragments)
CASES = [
    ("yaml-syntax", {"exp.yaml": "name: [unclosed\n"}, [], ["exp.yaml", "invalid YAML"]),
    ("yaml-tab", {"exp.yaml": "name: x\n\tentrypoint: 1\n"}, [], ["exp.yaml", "invalid YAML"]),
    ("yaml-not-mapping", {"exp.yaml": "- a\n- b\n"}, [], ["exp.yaml", "mapping"]),
    ("yaml-empty", {"exp.yaml": ""}, [], ["exp.yaml", "empty"]),
    ("exp-missing-file", {"exp.yaml": None}, [], ["exp.yaml", "no such file"]),
    ("unknown-top-key", {"exp.yaml": exp("colour: red\n")}, [], ["exp.yaml", "colour"]),
    ("unknown-nested-key", {"exp.yaml": exp("batch: {micro: 2}\n")}, [], ["exp.yaml", "batch.micro"]),
    ("typo-resources", {"exp.yaml": EXP.replace("nodes: 2", "nodse: 2")}, [], ["exp.yaml", "resources.nodse"]),
    ("wrong-type-nodes", {"exp.yaml": EXP.replace("nodes: 2", "nodes: two")}, [], ["exp.yaml", "resources.nodes"]),
    ("float-nodes", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 2.5")}, [], ["exp.yaml", "resources.nodes"]),
    ("args-not-list", {"exp.yaml": exp("", EXP.replace("{script: train.py}", "{script: train.py, args: --lr}"))},
     [], ["exp.yaml", "entrypoint.args"]),
    ("env-not-mapping", {"exp.yaml": exp("env: [A, B]\n")}, [], ["exp.yaml", "env"]),
    ("missing-name", {"exp.yaml": EXP.replace("name: good\n", "")}, [], ["exp.yaml", "name", "missing"]),
    ("bad-name", {"exp.yaml": EXP.replace("name: good", "name: 'bad name$(x)'")}, [], ["exp.yaml", "name"]),
    ("no-entrypoint", {"exp.yaml": "name: x\n"}, [], ["exp.yaml", "entrypoint"]),
    ("script-and-module", {"exp.yaml": EXP.replace("{script: train.py}", "{script: train.py, module: pkg.m}")},
     [], ["exp.yaml", "entrypoint"]),
    ("bad-module-name", {"exp.yaml": EXP.replace("{script: train.py}", "{module: 'a b'}")}, [],
     ["exp.yaml", "entrypoint.module"]),
    ("missing-script", {"exp.yaml": EXP.replace("train.py", "nope.py")}, [], ["exp.yaml", "entrypoint.script",
                                                                            "not found"]),
    ("bad-time", {"exp.yaml": EXP.replace('"01:00:00"', '"1 hour"')}, [], ["exp.yaml", "resources.time"]),
    ("bad-time-zero", {"exp.yaml": EXP.replace('"01:00:00"', '"0"')}, [], ["exp.yaml", "resources.time"]),
    ("bad-time-colons", {"exp.yaml": EXP.replace('"01:00:00"', '"1:2:3:4"')}, [], ["exp.yaml", "resources.time"]),
    ("time-over-max", {"exp.yaml": EXP.replace('"01:00:00"', '"2-00:00:00"')}, [],
     ["exp.yaml", "resources.time", "1-00:00:00", "max_time"]),
    ("too-many-gpus", {"exp.yaml": exp("", EXP.replace("nodes: 2,", "nodes: 2, gpus_per_node: 9,"))}, [],
     ["exp.yaml", "resources.gpus_per_node", "9", "has 4", "partitions.gpu.gpus_per_node"]),
    ("too-many-nodes", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 9")}, [],
     ["exp.yaml", "resources.nodes", "at most 8"]),
    ("zero-nodes", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 0")}, [], ["exp.yaml", "resources.nodes"]),
    ("too-much-mem", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, mem_gb: 1000,")}, [],
     ["exp.yaml", "resources.mem_gb", "256"]),
    ("too-many-cpus", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, cpus_per_task: 16,")}, [],
     ["exp.yaml", "resources.cpus_per_task", "32"]),
    ("unknown-partition", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, partition: nosuch,")}, [],
     ["exp.yaml", "resources.partition", "nosuch"]),
    ("bad-launcher", {"exp.yaml": exp("launcher: mpirun\n")}, [], ["exp.yaml", "launcher", "srun, torchrun"]),
    ("bad-strategy", {"exp.yaml": exp("strategy: {name: zero}\n")}, [],
     ["exp.yaml", "strategy.name", "ddp, fsdp, deepspeed, auto"]),
    ("negative-stall", {"exp.yaml": exp("watchdog: {stall_s: -1}\n")}, [], ["exp.yaml", "watchdog.stall_s", "0 (off)"]),
    ("negative-first-step", {"exp.yaml": exp("watchdog: {first_step_s: -5}\n")}, [],
     ["exp.yaml", "watchdog.first_step_s"]),
    ("bad-exclude-bad-nodes", {"exp.yaml": exp("requeue: {exclude_bad_nodes: maybe}\n")}, [],
     ["exp.yaml", "requeue.exclude_bad_nodes"]),
    ("bad-precision", {"exp.yaml": exp("precision: fp8\n")}, [], ["exp.yaml", "precision"]),
    ("bad-zero-stage", {"exp.yaml": exp("strategy: {name: deepspeed, zero_stage: 5}\n")}, [],
     ["exp.yaml", "strategy.zero_stage"]),
    ("offload-without-deepspeed", {"exp.yaml": exp("strategy: {name: ddp, offload_optimizer: cpu}\n")}, [],
     ["exp.yaml", "strategy.offload_optimizer"]),
    ("param-offload-stage2", {"exp.yaml": exp("strategy: {name: deepspeed, zero_stage: 2, offload_params: cpu}\n")},
     [], ["exp.yaml", "strategy.offload_params", "stage 3"]),
    ("nvme-without-path", {"exp.yaml": exp("strategy: {name: deepspeed, zero_stage: 3, offload_optimizer: nvme}\n")},
     [], ["exp.yaml", "strategy.nvme_path"]),
    ("indivisible-batch", {"exp.yaml": exp("strategy: {name: deepspeed}\nbatch: {global_size: 100, micro_size: 8}\n")},
     [], ["exp.yaml", "batch.global_size", "100"]),
    ("ds-batch-mismatch", {"exp.yaml": exp("strategy: {name: deepspeed}\nbatch: {micro_size: 2}\n"
                                           "deepspeed: {train_batch_size: 7}\n")}, [],
     ["exp.yaml", "deepspeed.train_batch_size"]),
    ("deepspeed-keys-with-ddp", {"exp.yaml": exp("deepspeed: {gradient_clipping: 1.0}\n")}, [],
     ["exp.yaml", "deepspeed", "ddp"]),
    ("lead-over-time", {"exp.yaml": exp("requeue: {signal_lead_s: 3600}\n")}, [],
     ["exp.yaml", "requeue.signal_lead_s"]),
    ("negative-requeue", {"exp.yaml": exp("requeue: {max: -1}\n")}, [], ["exp.yaml", "requeue.max"]),
    ("every-steps-zero", {"exp.yaml": exp("checkpoint: {every_steps: 0}\n")}, [], ["exp.yaml",
                                                                                  "checkpoint.every_steps"]),
    ("reserved-env", {"exp.yaml": exp("env: {GLAUNCH_RUN_DIR: /x}\n")}, [], ["exp.yaml", "env.GLAUNCH_RUN_DIR"]),
    ("bad-env-name", {"exp.yaml": exp("env: {'A-B': x}\n")}, [], ["exp.yaml", "env.A-B"]),
    ("unset-var-in-checkpoint-dir", {"exp.yaml": exp("checkpoint: {dir: /x/$GLAUNCH_TEST_UNSET/c}\n")}, [],
     ["exp.yaml", "checkpoint.dir", "GLAUNCH_TEST_UNSET"]),
    ("bad-interpolation", {"exp.yaml": exp("env: {A: '${nosuch.key}'}\n")}, [], ["exp.yaml", "env.A"]),
    ("override-no-equals", {"exp.yaml": EXP}, ["resources.nodes"], ["command line", "resources.nodes"]),
    ("override-unknown-key", {"exp.yaml": EXP}, ["resources.nodez=3"], ["command line", "resources.nodez"]),
    ("override-wrong-type", {"exp.yaml": EXP}, ["resources.nodes=many"], ["command line", "resources.nodes"]),
    ("override-bad-time", {"exp.yaml": EXP}, ["resources.time=soon"], ["command line", "resources.time"]),
    ("unknown-site", {"exp.yaml": EXP}, ["--site", "nosuch"], ["command line", "site", "nosuch"]),
    ("unknown-site-in-exp", {"exp.yaml": exp("site: nosuch\n")}, ["--site-from-exp"], ["exp.yaml", "site",
                                                                                       "nosuch"]),
    ("site-file-missing", {"exp.yaml": EXP}, ["--site", "./missing.yaml"], ["missing.yaml", "not found"]),
    ("site-unknown-key", {"site_configs/mysite.yaml": site("colour: red\n")}, [], ["mysite.yaml", "colour"]),
    ("site-partition-unknown-key", {"site_configs/mysite.yaml": SITE.replace("max_nodes: 8", "max_node: 8")}, [],
     ["mysite.yaml", "partitions.gpu.max_node"]),
    ("site-missing-gpus", {"site_configs/mysite.yaml": site("  big: {max_nodes: 2}\n")}, [],
     ["mysite.yaml", "partitions.big.gpus_per_node"]),
    ("site-bad-scheduler", {"site_configs/mysite.yaml": SITE.replace("scheduler: slurm", "scheduler: pbs")}, [],
     ["mysite.yaml", "scheduler", "slurm, local"]),
    ("site-bad-directive", {"site_configs/mysite.yaml": site("gpu_directive: gpus\n")}, [],
     ["mysite.yaml", "gpu_directive"]),
    ("site-bad-container", {"site_configs/mysite.yaml": site("container: {runtime: docker, image: x}\n")}, [],
     ["mysite.yaml", "container.runtime"]),
    ("site-bad-default-partition", {"site_configs/mysite.yaml": SITE.replace("default_partition: gpu",
                                                                             "default_partition: nope")}, [],
     ["mysite.yaml", "default_partition", "nope"]),
    ("site-bad-max-time", {"site_configs/mysite.yaml": SITE.replace('"1-00:00:00"', '"forever"')}, [],
     ["mysite.yaml", "partitions.gpu.max_time"]),
    ("site-sbatch-nested", {"site_configs/mysite.yaml": site("sbatch: {mail: {a: 1}}\n")}, [],
     ["mysite.yaml", "sbatch.mail"]),
    ("extends-self", {"site_configs/mysite.yaml": site("extends: mysite\n")}, [], ["mysite.yaml", "extends",
                                                                                  "cycle"]),
    ("extends-cycle", {"site_configs/mysite.yaml": site("extends: other\n"),
                       "site_configs/other.yaml": "name: other\nextends: mysite\n"}, [],
     ["extends", "cycle", "other.yaml"]),
    ("extends-unknown", {"site_configs/mysite.yaml": site("extends: nosuchbase\n")}, [],
     ["mysite.yaml", "extends", "nosuchbase"]),
    ("extends-bad-type", {"site_configs/mysite.yaml": site("extends: {a: 1}\n")}, [], ["mysite.yaml", "extends"]),
    ("parent-bad-value", {"site_configs/mysite.yaml": site("extends: base\n"),
                          "site_configs/base.yaml": "name: base\nqos: [1, 2]\n"}, [], ["base.yaml", "qos"]),
    ("local-two-nodes", {"exp.yaml": EXP}, ["--site", "local"], ["exp.yaml", "resources.nodes"]),
    # --- files that are no config file ---
    ("exp-fifo", {"exp.yaml": FIFO}, [], ["exp.yaml", "not a regular file"]),
    ("exp-dev-zero", {"exp.yaml": Link("/dev/zero")}, [], ["exp.yaml", "not a regular file"]),
    ("exp-directory", {"exp.yaml": DIRECTORY}, [], ["exp.yaml", "is a directory"]),
    ("exp-too-large", {"exp.yaml": EXP + "# " + "x" * (1 << 20) + "\n"}, [], ["exp.yaml", "larger than 1 MiB"]),
    ("exp-not-utf8", {"exp.yaml": EXP + "env: {A: \udcff}\n"}, [], ["exp.yaml", "not UTF-8"]),
    ("site-fifo", {"site_configs/mysite.yaml": FIFO}, [], ["mysite.yaml", "not a regular file"]),
    ("site-path-fifo", {"pipe.yaml": FIFO}, ["--site", "./pipe.yaml"], ["pipe.yaml", "not a regular file"]),
    # --- YAML that no config needs ---
    ("yaml-alias-bomb", {"exp.yaml": EXP + "".join(
        f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n" for i in range(10))},
     [], ["exp.yaml", "aliases expand to more than"]),
    ("yaml-recursive-alias", {"exp.yaml": exp("deepspeed: &d {a: *d}\n")}, [], ["exp.yaml", "deepspeed.a",
                                                                               "recursive alias"]),
    ("yaml-duplicate-key", {"exp.yaml": EXP + "resources: {nodes: 1}\n"}, [],
     ["exp.yaml:4", "resources", "duplicate key", "lines 3 and 4"]),
    ("yaml-duplicate-nested-key", {"exp.yaml": exp("strategy:\n  name: ddp\n  name: deepspeed\n")}, [],
     ["exp.yaml:6", "strategy.name", "lines 5 and 6"]),
    ("site-duplicate-key", {"site_configs/mysite.yaml": site("partitions:\n  gpu: {gpus_per_node: 8}\n")}, [],
     ["mysite.yaml:7", "partitions", "lines 4 and 7"]),
    ("site-duplicate-partition-key", {"site_configs/mysite.yaml": SITE.replace("max_nodes: 8", "max_nodes: 8, "
                                                                              "max_nodes: 16")}, [],
     ["mysite.yaml", "partitions.gpu.max_nodes", "duplicate key"]),
    ("parent-duplicate-key", {"site_configs/mysite.yaml": site("extends: base\n"),
                              "site_configs/base.yaml": "name: base\nqos: a\nqos: b\n"}, [],
     ["base.yaml:3", "qos", "lines 2 and 3"]),
    ("yaml-deep-nesting", {"exp.yaml": exp("deepspeed: " + "[" * 5000 + "]" * 5000 + "\n")}, [],
     ["exp.yaml", "nested deeper than"]),
    ("yaml-python-tag", {"exp.yaml": exp("env: {A: !!python/object/apply:os.system [touch PWNED]}\n")}, [],
     ["exp.yaml", "env.A", "!!python/object/apply:os.system", "not supported"]),
    ("yaml-two-documents", {"exp.yaml": EXP + "---\nname: other\n"}, [], ["exp.yaml", "more than one YAML document"]),
    ("extends-too-deep", {"site_configs/mysite.yaml": site("extends: s0\n"), **{
        f"site_configs/s{i}.yaml": f"name: s{i}\nextends: s{i + 1}\n" for i in range(100)}}, [],
     ["extends chain is deeper than"]),
    # --- typed values: the field's type decides, nothing ambiguous passes ---
    ("nodes-bool", {"exp.yaml": EXP.replace("nodes: 2", "nodes: true")}, [], ["exp.yaml", "resources.nodes",
                                                                             "got true"]),
    ("nodes-leading-zero", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 02")}, [], ["exp.yaml", "resources.nodes",
                                                                                   "leading zero"]),
    ("nodes-exponent", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 2e0")}, [], ["exp.yaml", "resources.nodes",
                                                                                "whole number"]),
    ("nodes-out-of-range", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 9223372036854775808")}, [],
     ["exp.yaml", "resources.nodes", "out of range"]),
    ("env-value-null", {"exp.yaml": exp("env: {A: null}\n")}, [], ["exp.yaml", "env.A", "got null"]),
    ("args-item-mapping", {"exp.yaml": EXP.replace("{script: train.py}", "{script: train.py, args: [{a: 1}]}")},
     [], ["exp.yaml", "entrypoint.args[0]", "a single value"]),
    ("site-preemptible-yes", {"site_configs/mysite.yaml": SITE.replace("max_nodes: 4", "max_nodes: 4, "
                                                                       "preemptible: yes")}, [],
     ["mysite.yaml", "partitions.cpu.preemptible", "true or false"]),
    ("nul-in-value", {"exp.yaml": exp('env: {A: "a\\0b"}\n')}, [], ["exp.yaml", "env.A", "NUL"]),
    # --- NaN and infinity, wherever a number is read ---
    ("mem-nan", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, mem_gb: .nan,")}, [],
     ["exp.yaml", "resources.mem_gb", "finite"]),
    ("mem-inf", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, mem_gb: .inf,")}, [],
     ["exp.yaml", "resources.mem_gb", "finite"]),
    ("mem-overflow", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, mem_gb: 1e400,")}, [],
     ["exp.yaml", "resources.mem_gb", "too large"]),
    ("params-nan", {"exp.yaml": exp("model: {params: NaN}\n")}, [], ["exp.yaml", "model.params", "finite"]),
    ("override-params-inf", {"exp.yaml": EXP}, ["model.params=inf"], ["command line", "model.params", "finite"]),
    ("deepspeed-nan", {"exp.yaml": exp("strategy: {name: deepspeed}\ndeepspeed: {gradient_clipping: .nan}\n")}, [],
     ["exp.yaml", "deepspeed.gradient_clipping", "finite"]),
    ("site-gpu-mem-nan", {"site_configs/mysite.yaml": SITE.replace("gpu_mem_gb: 80", "gpu_mem_gb: .nan")}, [],
     ["mysite.yaml", "partitions.gpu.gpu_mem_gb", "finite"]),
    ("site-mem-inf", {"site_configs/mysite.yaml": SITE.replace("mem_gb: 256", "mem_gb: .inf")}, [],
     ["mysite.yaml", "partitions.gpu.mem_gb", "finite"]),
    ("site-plan-nan", {"site_configs/mysite.yaml": site("plan: {headroom: .nan}\n")}, [],
     ["mysite.yaml", "plan.headroom", "finite"]),
    # --- times, names, reserved environment variables ---
    ("time-61-minutes", {"exp.yaml": EXP.replace('"01:00:00"', '"01:61:00"')}, [],
     ["exp.yaml", "resources.time", "minutes must be at most 59"]),
    ("time-61-seconds", {"exp.yaml": EXP.replace('"01:00:00"', '"10:61"')}, [],
     ["exp.yaml", "resources.time", "seconds must be at most 59"]),
    ("time-25-hours-after-days", {"exp.yaml": EXP.replace('"01:00:00"', '"0-25:00:00"')}, [],
     ["exp.yaml", "resources.time", "hours must be at most 23"]),
    ("site-max-time-48h", {"site_configs/mysite.yaml": SITE.replace('"1-00:00:00"', "48h")}, [],
     ["mysite.yaml", "partitions.gpu.max_time", "not a time"]),
    ("site-max-time-unused-partition", {"site_configs/mysite.yaml": SITE.replace("max_nodes: 4}", "max_nodes: 4, "
                                                                                 "max_time: '00:90:00'}")}, [],
     ["mysite.yaml", "partitions.cpu.max_time"]),
    ("name-leading-dash", {"exp.yaml": EXP.replace("name: good", "name: -rf")}, [], ["exp.yaml", "name",
                                                                                   "not starting with"]),
    ("name-leading-dot", {"exp.yaml": EXP.replace("name: good", "name: ..")}, [], ["exp.yaml", "name"]),
    ("override-name-dash", {"exp.yaml": EXP}, ["name=--help"], ["command line", "name"]),
    ("site-name-leading-dash", {"site_configs/mysite.yaml": SITE.replace("name: mysite", "name: -x")}, [],
     ["mysite.yaml", "name"]),
    ("partition-leading-dash", {"site_configs/mysite.yaml": site("  -p: {gpus_per_node: 1}\n")}, [],
     ["mysite.yaml", "partitions.-p"]),
    ("env-slurm-reserved", {"exp.yaml": exp("env: {SLURM_JOB_ID: 'x[$(touch PWNED)]'}\n")}, [],
     ["exp.yaml", "env.SLURM_JOB_ID", "SLURM_*"]),
    ("env-sbatch-reserved", {"exp.yaml": exp("env: {SBATCH_TIMELIMIT: '5'}\n")}, [], ["exp.yaml",
                                                                                    "env.SBATCH_TIMELIMIT"]),
    ("env-srun-reserved", {"exp.yaml": exp("env: {SRUN_CPUS_PER_TASK: '5'}\n")}, [], ["exp.yaml",
                                                                                     "env.SRUN_CPUS_PER_TASK"]),
    ("env-salloc-reserved", {"exp.yaml": exp("env: {SALLOC_PARTITION: x}\n")}, [], ["exp.yaml",
                                                                                  "env.SALLOC_PARTITION"]),
    ("env-bash-variable", {"exp.yaml": exp("env: {BASH_ENV: /tmp/x}\n")}, [], ["exp.yaml", "env.BASH_ENV"]),
    ("override-env-reserved", {"exp.yaml": EXP}, ["env.SLURM_NODEID=0"], ["command line", "env.SLURM_NODEID"]),
    ("site-env-reserved", {"site_configs/mysite.yaml": site("env: {SLURM_JOB_ID: '1'}\n")}, [],
     ["mysite.yaml", "env.SLURM_JOB_ID"]),
    ("site-env-glaunch", {"site_configs/mysite.yaml": site("env: {GLAUNCH_RUN_DIR: /x}\n")}, [],
     ["mysite.yaml", "env.GLAUNCH_RUN_DIR"]),
    # --- overrides: no sections where a value goes ---
    ("override-mapping-into-env", {"exp.yaml": EXP}, ["env.A={x: 1}"], ["command line", "env.A", "single value"]),
    ("override-list-into-env", {"exp.yaml": EXP}, ["env.A=[1, 2]"], ["command line", "env.A", "single value"]),
    ("override-mapping-into-time", {"exp.yaml": EXP}, ["resources.time={h: 1}"], ["command line", "resources.time"]),
    ("override-list-into-nodes", {"exp.yaml": EXP}, ["resources.nodes=[2]"], ["command line", "resources.nodes"]),
    ("override-scalar-into-env", {"exp.yaml": EXP}, ["env=A"], ["command line", "env", "mapping"]),
    ("interpolation-unclosed", {"exp.yaml": exp("env: {A: '${resources.nodes'}\n")}, [], ["exp.yaml", "env.A",
                                                                                        "unclosed"]),
    ("interpolation-loop", {"exp.yaml": exp("env: {A: '${env.B}', B: '${env.A}'}\n")}, [], ["exp.yaml", "env.A"]),
    # --- profile checks `sites validate` shares with `submit` ---
    ("site-sbatch-owned-directive", {"site_configs/mysite.yaml": site("sbatch: {nodes: 64}\n")}, [],
     ["mysite.yaml", "sbatch.nodes", "written by glaunch"]),
    ("site-sbatch-owned-output", {"site_configs/mysite.yaml": site("sbatch: {output: /tmp/x}\n")}, [],
     ["mysite.yaml", "sbatch.output"]),
    ("site-sbatch-newline", {"site_configs/mysite.yaml": site("sbatch: {comment: \"a\\nb\"}\n")}, [],
     ["mysite.yaml", "sbatch.comment", "one line"]),
    ("site-account-escape", {"site_configs/mysite.yaml": site("account: \"a\\eb\"\n")}, [],
     ["mysite.yaml", "account", "control characters"]),
    ("site-python-unbalanced", {"site_configs/mysite.yaml": site("python: \"python3 'x\"\n")}, [],
     ["mysite.yaml", "python", "not a command line"]),
    # --- fsdp: offload and DeepSpeed keys are refused ---
    ("fsdp-offload-params", {"exp.yaml": exp("strategy: {name: fsdp, offload_params: cpu}\n")}, [],
     ["exp.yaml", "strategy.offload_params", "fsdp", "CPUOffloadPolicy", "strategy.name: deepspeed"]),
    ("fsdp-offload-optimizer", {"exp.yaml": exp("strategy: {name: fsdp, offload_optimizer: cpu}\n")}, [],
     ["exp.yaml", "strategy.offload_optimizer", "fsdp"]),
    ("fsdp-override-offload", {"exp.yaml": exp("strategy: {name: fsdp}\n")}, ["strategy.offload_params=nvme"],
     ["command line", "strategy.offload_params", "fsdp"]),
    ("fsdp-deepspeed-keys", {"exp.yaml": exp("strategy: {name: fsdp}\ndeepspeed: {gradient_clipping: 1.0}\n")}, [],
     ["exp.yaml", "deepspeed", "strategy.name is 'fsdp'"]),
]


@pytest.mark.parametrize("files,args,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(files, args, fragments, tmp_path, monkeypatch, capsys, isolated_env):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GLAUNCH_TEST_UNSET", raising=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "site_configs").mkdir()
    write_files(tmp_path, files)
    site_args = [] if ("--site" in args or "--site-from-exp" in args) else ["--site", "mysite"]
    args = [a for a in args if a != "--site-from-exp"]
    runs = tmp_path / "runs"
    argv = ["glaunch", "submit", "exp.yaml", "--dry-run", "--runs-dir", str(runs), *site_args, *args]
    code, out, err = run_cli(monkeypatch, capsys, argv)
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert not runs.exists(), "nothing may be written for bad input"
    assert not list(tmp_path.rglob("PWNED*"))


def write_files(root, files):
    for name, text in {"exp.yaml": EXP, "site_configs/mysite.yaml": SITE, **files}.items():
        path = root / name
        if text is None:               # the file must not exist
            continue
        if text is FIFO:
            os.mkfifo(path)
        elif text is DIRECTORY:
            path.mkdir()
        elif isinstance(text, Link):
            path.symlink_to(text.target)
        else:
            path.write_text(text, errors="surrogateescape")


HANG_S = 120      # only a blocked read (a FIFO, a device) comes near it, however loaded the machine


def _hung(signum, frame):
    raise TimeoutError(f"the command did not end within {HANG_S} s: it blocks")


def run_cli(monkeypatch, capsys, argv):
    """(exit code, stdout, stderr) of the CLI run in-process; a command that blocks fails."""
    monkeypatch.setattr(sys, "argv", argv)
    previous = signal.signal(signal.SIGALRM, _hung)
    signal.alarm(HANG_S)
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    return code, out, err


SITE_ONLY = [c for c in CASES if set(c[1]) <= {"site_configs/mysite.yaml"} and not c[2]]


@pytest.mark.parametrize("files,fragments", [(c[1], c[3]) for c in SITE_ONLY], ids=[c[0] for c in SITE_ONLY])
def test_sites_validate_refuses_what_submit_refuses(files, fragments, tmp_path, monkeypatch, capsys, isolated_env):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "site_configs").mkdir()
    write_files(tmp_path, files)
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "validate", "mysite"])
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"


def test_sites_validate_passes_every_shipped_profile(monkeypatch, capsys, isolated_env):
    from launcher.config.sites import SHIPPED_SITES

    names = sorted(p.stem for p in SHIPPED_SITES.glob("*.yaml"))
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "validate", *names])
    assert code == 0, (out, err)
    assert out.count("ok ") == len(names)


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES), "ids are unique"


def test_sites_validate_reports_bad_profile(tmp_path, monkeypatch, capsys, isolated_env):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npartitions: {gpu: {gpus_per_node: four}}\n")
    monkeypatch.setattr(sys, "argv", ["glaunch", "sites", "validate", str(bad), "local"])
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    _, err = capsys.readouterr()
    assert exit_info.value.code == 2
    assert "bad.yaml" in err and "partitions.gpu.gpus_per_node" in err
