"""Bad input -> exit 2, a message naming the file and the key, no traceback, nothing written.

Each row: files to write (name -> text), extra CLI args, and the fragments stderr must hold.
"""

import sys
import pytest

from launcher import cli

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
    ("bad-strategy", {"exp.yaml": exp("strategy: {name: fsdp}\n")}, [], ["exp.yaml", "strategy.name"]),
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
]


@pytest.mark.parametrize("files,args,fragments", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(files, args, fragments, tmp_path, monkeypatch, capsys, isolated_env):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GLAUNCH_TEST_UNSET", raising=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "site_configs").mkdir()
    files = {"exp.yaml": EXP, "site_configs/mysite.yaml": SITE, **files}
    for name, text in files.items():
        if text is not None:           # None: the file must not exist
            (tmp_path / name).write_text(text)
    site_args = [] if ("--site" in args or "--site-from-exp" in args) else ["--site", "mysite"]
    args = [a for a in args if a != "--site-from-exp"]
    runs = tmp_path / "runs"
    argv = ["glaunch", "submit", "exp.yaml", "--dry-run", "--runs-dir", str(runs), *site_args, *args]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    out, err = capsys.readouterr()
    assert exit_info.value.code == 2, (out, err)
    assert "Traceback" not in out + err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"
    assert not runs.exists(), "nothing may be written for bad input"


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40


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
