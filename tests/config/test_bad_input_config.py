"""Bad input the configuration stage refuses: loading the experiment and the site profile
(YAML, what may be read as a config file at all), their schema and typed values,
interpolation, overrides, the search for the site, a profile's `extends` chain and the
checks `glaunch sites validate` applies to a profile. Each row: the input and the
fragments its one error line must hold (tests/badinput.py says what else is checked)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from badinput import (DIRECTORY, EXP, FIFO, ONE_PARTITION_SITE, QUIET_EXP, SITE, Link, Refused, RefusedCall,
                      refuse, refuse_call, run_cli, table, write_files)
from launcher import api
from launcher.config import load
from launcher.config.load import parse_overrides
from launcher.config.schema import MAX_RUN_NAME
from launcher.config.sitechecks import OWN_SBATCH_OPTIONS
from launcher.config.sites import load_site
from launcher.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def exp(extra: str = "", base: str = EXP) -> str:
    return base + extra


def site(extra: str = "", base: str = SITE) -> str:
    return base + extra


DS = "strategy: {name: deepspeed, zero_stage: 2}\nbatch: {micro_size: 2}\n"
PYXIS = "container: {runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.09-py3', mounts: [%s]}\n"


def entry(entrypoint: str) -> str:
    """EXP with `entrypoint:` in flow style."""
    return EXP.replace("entrypoint: {script: train.py}", "entrypoint: " + entrypoint)


def one_partition_site(extra: str) -> dict[str, str]:
    return {"site_configs/mysite.yaml": ONE_PARTITION_SITE + extra}


CASES = [
    # --- what can be read as a config file at all ---
    Refused("yaml-syntax", {"exp.yaml": "name: [unclosed\n"}, [], ["exp.yaml", "invalid YAML"]),
    Refused("yaml-tab", {"exp.yaml": "name: x\n\tentrypoint: 1\n"}, [], ["exp.yaml", "invalid YAML"]),
    Refused("yaml-not-mapping", {"exp.yaml": "- a\n- b\n"}, [], ["exp.yaml", "mapping"]),
    Refused("yaml-empty", {"exp.yaml": ""}, [], ["exp.yaml", "empty"]),
    Refused("document-marker-alone", {"exp.yaml": "---\n"}, [], ["exp.yaml: the file is empty"]),
    Refused("document-markers-and-a-comment", {"exp.yaml": "# only a comment\n--- \n...\n"}, [],
            ["exp.yaml: the file is empty"]),
    Refused("exp-missing-file", {"exp.yaml": None}, [], ["exp.yaml", "no such file"]),
    Refused("exp-fifo", {"exp.yaml": FIFO}, [], ["exp.yaml", "not a regular file"]),
    Refused("exp-dev-zero", {"exp.yaml": Link("/dev/zero")}, [], ["exp.yaml", "not a regular file"]),
    Refused("exp-directory", {"exp.yaml": DIRECTORY}, [], ["exp.yaml", "is a directory"]),
    Refused("exp-directory-plan", {"exp.yaml": DIRECTORY}, [], ["exp.yaml", "is a directory"], command="plan"),
    Refused("exp-too-large", {"exp.yaml": EXP + "# " + "x" * (1 << 20) + "\n"}, [], ["exp.yaml", "larger than 1 MiB"]),
    Refused("exp-not-utf8", {"exp.yaml": EXP + "env: {A: \udcff}\n"}, [], ["exp.yaml", "not UTF-8"]),
    Refused("site-fifo", {"site_configs/mysite.yaml": FIFO}, [], ["mysite.yaml", "not a regular file"]),
    Refused("site-path-fifo", {"pipe.yaml": FIFO}, ["--site", "./pipe.yaml"], ["pipe.yaml", "not a regular file"]),
    Refused("site-profile-as-the-experiment", {"exp.yaml": QUIET_EXP}, [],
            ["mysite.yaml:4: partitions", "this is a site profile", "give it with --site"],
            experiment="site_configs/mysite.yaml"),
    # --- YAML that no config needs ---
    Refused("yaml-alias-bomb", {"exp.yaml": EXP + "".join(
               f"x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n" for i in range(10))},
            [], ["exp.yaml", "aliases expand to more than"]),
    Refused("yaml-recursive-alias", {"exp.yaml": exp("deepspeed: &d {a: *d}\n")}, [], ["exp.yaml", "deepspeed.a",
                                                                                      "recursive alias"]),
    Refused("yaml-duplicate-key", {"exp.yaml": EXP + "resources: {nodes: 1}\n"}, [],
            ["exp.yaml:4", "resources", "duplicate key", "lines 3 and 4"]),
    Refused("yaml-duplicate-nested-key", {"exp.yaml": exp("strategy:\n  name: ddp\n  name: deepspeed\n")}, [],
            ["exp.yaml:6", "strategy.name", "lines 5 and 6"]),
    Refused("yaml-deep-nesting", {"exp.yaml": exp("deepspeed: " + "[" * 5000 + "]" * 5000 + "\n")}, [],
            ["exp.yaml", "nested deeper than"]),
    Refused("yaml-python-tag", {"exp.yaml": exp("env: {A: !!python/object/apply:os.system [touch PWNED]}\n")}, [],
            ["exp.yaml", "env.A", "!!python/object/apply:os.system", "not supported"]),
    Refused("yaml-two-documents", {"exp.yaml": EXP + "---\nname: other\n"}, [], ["exp.yaml", "more than one YAML document"]),
    # --- the experiment's schema: keys, names, the entry point ---
    Refused("unknown-top-key", {"exp.yaml": exp("colour: red\n")}, [], ["exp.yaml", "colour"]),
    Refused("unknown-nested-key", {"exp.yaml": exp("batch: {micro: 2}\n")}, [], ["exp.yaml", "batch.micro"]),
    Refused("typo-resources", {"exp.yaml": EXP.replace("nodes: 2", "nodse: 2")}, [], ["exp.yaml", "resources.nodse"]),
    Refused("unknown-key-empty", {"exp.yaml": QUIET_EXP + "'': 1\n"}, [], ["unknown key ''"]),
    Refused("unknown-key-leading-space", {"exp.yaml": QUIET_EXP + "' resources': 1\n"}, [],
            ["unknown key ' resources'"]),
    Refused("unknown-key-zero-width-space", {"exp.yaml": QUIET_EXP + "resources\u200b: 1\n"}, [],
            ["unknown key 'resources\\u200b'"]),
    # YAML's explicit keys (`? key`) have no length limit: the error line stays short.
    Refused("unknown-key-huge", {"exp.yaml": QUIET_EXP + "? " + "k" * 500000 + "\n: 1\n"}, [],
            ["... (500000 characters): unknown key"], check=lambda err: len(err) < 1000),
    Refused("missing-name", {"exp.yaml": EXP.replace("name: good\n", "")}, [], ["exp.yaml", "name", "missing"]),
    Refused("bad-name", {"exp.yaml": EXP.replace("name: good", "name: 'bad name$(x)'")}, [], ["exp.yaml", "name"]),
    Refused("name-leading-dash", {"exp.yaml": EXP.replace("name: good", "name: -rf")}, [], ["exp.yaml", "name",
                                                                                          "not starting with"]),
    Refused("name-leading-dot", {"exp.yaml": EXP.replace("name: good", "name: ..")}, [], ["exp.yaml", "name"]),
    Refused("override-name-dash", {"exp.yaml": EXP}, ["name=--help"], ["command line", "name"]),
    Refused("name-too-long", {"exp.yaml": QUIET_EXP.replace("name: good", "name: " + "a" * 300)}, [],
            ["exp.yaml:1: name", "300 characters", str(MAX_RUN_NAME)]),
    Refused("no-entrypoint", {"exp.yaml": "name: x\n"}, [], ["exp.yaml", "entrypoint"]),
    Refused("script-and-module", {"exp.yaml": EXP.replace("{script: train.py}", "{script: train.py, module: pkg.m}")},
            [], ["exp.yaml", "entrypoint"]),
    Refused("bad-module-name", {"exp.yaml": EXP.replace("{script: train.py}", "{module: 'a b'}")}, [],
            ["exp.yaml", "entrypoint.module"]),
    Refused("args-not-list", {"exp.yaml": exp("", EXP.replace("{script: train.py}", "{script: train.py, args: --lr}"))},
            [], ["exp.yaml", "entrypoint.args"]),
    Refused("env-not-mapping", {"exp.yaml": exp("env: [A, B]\n")}, [], ["exp.yaml", "env"]),
    Refused("bad-launcher", {"exp.yaml": exp("launcher: mpirun\n")}, [], ["exp.yaml", "launcher", "srun, torchrun"]),
    Refused("bad-strategy", {"exp.yaml": exp("strategy: {name: zero}\n")}, [],
            ["exp.yaml", "strategy.name", "ddp, fsdp, deepspeed, auto"]),
    Refused("bad-exclude-bad-nodes", {"exp.yaml": exp("requeue: {exclude_bad_nodes: maybe}\n")}, [],
            ["exp.yaml", "requeue.exclude_bad_nodes"]),
    Refused("bad-requeue-mode", {"exp.yaml": exp("requeue: {mode: restart}\n")}, [],
            ["exp.yaml", "requeue.mode", "resubmit, requeue"]),
    Refused("override-bad-requeue-mode", {"exp.yaml": EXP}, ["requeue.mode=never"],
            ["command line", "requeue.mode", "resubmit, requeue"]),
    Refused("bad-precision", {"exp.yaml": exp("precision: fp8\n")}, [], ["exp.yaml", "precision"]),
    Refused("stall-not-auto", {"exp.yaml": exp("watchdog: {stall_s: automatic}\n")}, [],
            ["exp.yaml", "watchdog.stall_s", "'automatic' is not auto, 0 (off) or a number of seconds"]),
    Refused("stall-negative", {"exp.yaml": exp("watchdog: {stall_s: -5}\n")}, [], ["exp.yaml", "watchdog.stall_s"]),
    Refused("stall-bool", {"exp.yaml": exp("watchdog: {stall_s: true}\n")}, [], ["exp.yaml", "watchdog.stall_s"]),
    Refused("stall-list", {"exp.yaml": exp("watchdog: {stall_s: [600]}\n")}, [], ["exp.yaml", "watchdog.stall_s"]),
    Refused("stall-infinite", {"exp.yaml": exp("watchdog: {stall_s: .inf}\n")}, [], ["exp.yaml", "watchdog.stall_s"]),
    Refused("auto-floor-negative", {"exp.yaml": exp("watchdog: {auto_floor_s: -1}\n")}, [],
            ["exp.yaml", "watchdog.auto_floor_s"]),
    Refused("bad-slow-node", {"exp.yaml": exp("watchdog: {slow_node: drain}\n")}, [],
            ["exp.yaml", "watchdog.slow_node", "report, exclude"]),
    # --- typed values: the field's type decides, nothing ambiguous passes ---
    Refused("wrong-type-nodes", {"exp.yaml": EXP.replace("nodes: 2", "nodes: two")}, [], ["exp.yaml", "resources.nodes"]),
    Refused("float-nodes", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 2.5")}, [], ["exp.yaml", "resources.nodes"]),
    Refused("nodes-bool", {"exp.yaml": EXP.replace("nodes: 2", "nodes: true")}, [], ["exp.yaml", "resources.nodes",
                                                                                    "got true"]),
    Refused("nodes-leading-zero", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 02")}, [], ["exp.yaml", "resources.nodes",
                                                                                          "leading zero"]),
    Refused("nodes-exponent", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 2e0")}, [], ["exp.yaml", "resources.nodes",
                                                                                       "whole number"]),
    Refused("nodes-out-of-range", {"exp.yaml": EXP.replace("nodes: 2", "nodes: 9223372036854775808")}, [],
            ["exp.yaml", "resources.nodes", "out of range"]),
    Refused("spare-nodes-negative", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, spare_nodes: -1,")}, [],
            ["exp.yaml", "resources.spare_nodes", "0 or more"]),
    Refused("spare-nodes-float", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, spare_nodes: 0.5,")}, [],
            ["exp.yaml", "resources.spare_nodes"]),
    Refused("spare-nodes-text", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, spare_nodes: one,")}, [],
            ["exp.yaml", "resources.spare_nodes"]),
    Refused("env-value-null", {"exp.yaml": exp("env: {A: null}\n")}, [], ["exp.yaml", "env.A", "got null"]),
    Refused("args-item-mapping", {"exp.yaml": EXP.replace("{script: train.py}", "{script: train.py, args: [{a: 1}]}")},
            [], ["exp.yaml", "entrypoint.args[0]", "a single value"]),
    Refused("nul-in-value", {"exp.yaml": exp('env: {A: "a\\0b"}\n')}, [], ["exp.yaml", "env.A", "NUL"]),
    # --- NaN and infinity, wherever a number is read ---
    Refused("mem-nan", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, mem_gb: .nan,")}, [],
            ["exp.yaml", "resources.mem_gb", "finite"]),
    Refused("mem-inf", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, mem_gb: .inf,")}, [],
            ["exp.yaml", "resources.mem_gb", "finite"]),
    Refused("mem-overflow", {"exp.yaml": EXP.replace("nodes: 2,", "nodes: 2, mem_gb: 1e400,")}, [],
            ["exp.yaml", "resources.mem_gb", "too large"]),
    Refused("params-nan", {"exp.yaml": exp("model: {params: NaN}\n")}, [], ["exp.yaml", "model.params", "finite"]),
    Refused("override-params-inf", {"exp.yaml": EXP}, ["model.params=inf"], ["command line", "model.params", "finite"]),
    Refused("deepspeed-nan", {"exp.yaml": exp("strategy: {name: deepspeed}\ndeepspeed: {gradient_clipping: .nan}\n")}, [],
            ["exp.yaml", "deepspeed.gradient_clipping", "finite"]),
    Refused("deepspeed-block-clipping-nan", {"exp.yaml": EXP + DS + "deepspeed: {gradient_clipping: .nan}\n",
                                             **one_partition_site("")}, [],
            ["exp.yaml", "deepspeed.gradient_clipping"]),
    Refused("deepspeed-block-lr-inf", {"exp.yaml": EXP + DS + "deepspeed: {optimizer: {params: {lr: .inf}}}\n",
                                       **one_partition_site("")}, [],
            ["exp.yaml", "deepspeed.optimizer.params.lr"]),
    Refused("deepspeed-block-betas-minus-inf", {"exp.yaml": EXP + DS + "deepspeed: {optimizer: {params: {betas: "
                                                                       "[0.9, -.inf]}}}\n",
                                                **one_partition_site("")}, [],
            ["exp.yaml", "deepspeed.optimizer.params.betas[1]"]),
    Refused("plan-params-nan", {"exp.yaml": EXP + "model: {params: .nan}\n", **one_partition_site("")}, ["--json"],
            ["model.params"], command="plan"),
    Refused("plan-params-inf", {"exp.yaml": EXP + "model: {params: .inf}\n", **one_partition_site("")}, ["--json"],
            ["model.params"], command="plan"),
    # --- the model's activation checkpointing and attention, for the planner ---
    Refused("bad-activation-checkpointing", {"exp.yaml": exp("model: {activation_checkpointing: partial}\n")}, [],
            ["exp.yaml", "model.activation_checkpointing", "none, selective, full"]),
    Refused("activation-checkpointing-bool", {"exp.yaml": exp("model: {activation_checkpointing: true}\n")}, [],
            ["exp.yaml", "model.activation_checkpointing"]),
    Refused("override-activation-checkpointing", {"exp.yaml": EXP}, ["model.activation_checkpointing=always"],
            ["command line", "model.activation_checkpointing", "none, selective, full"]),
    Refused("bad-flash-attention", {"exp.yaml": exp("model: {flash_attention: maybe}\n")}, [],
            ["exp.yaml", "model.flash_attention", "true or false"]),
    Refused("flash-attention-number", {"exp.yaml": exp("model: {flash_attention: 2}\n")}, [],
            ["exp.yaml", "model.flash_attention"]),
    Refused("plan-bad-activation-checkpointing", {"exp.yaml": EXP + "model: {params: 7e9, activation_checkpointing: "
                                                                    "Full}\n", **one_partition_site("")},
            ["--json"], ["exp.yaml", "model.activation_checkpointing"], command="plan"),
    Refused("plan-override-flash-attention", {"exp.yaml": EXP + "model: {params: 7e9}\n", **one_partition_site("")},
            ["model.flash_attention=yes please"], ["command line", "model.flash_attention"], command="plan"),
    Refused("plan-params-minus-inf", {"exp.yaml": EXP + "model: {params: -.inf}\n", **one_partition_site("")},
            ["--json"], ["model.params"], command="plan"),
    # --- environment variables the job's own machinery sets ---
    Refused("reserved-env", {"exp.yaml": exp("env: {GLAUNCH_RUN_DIR: /x}\n")}, [], ["exp.yaml", "env.GLAUNCH_RUN_DIR"]),
    Refused("bad-env-name", {"exp.yaml": exp("env: {'A-B': x}\n")}, [], ["exp.yaml", "env.A-B"]),
    Refused("env-slurm-reserved", {"exp.yaml": exp("env: {SLURM_JOB_ID: 'x[$(touch PWNED)]'}\n")}, [],
            ["exp.yaml", "env.SLURM_JOB_ID", "SLURM_*"]),
    Refused("env-sbatch-reserved", {"exp.yaml": exp("env: {SBATCH_TIMELIMIT: '5'}\n")}, [], ["exp.yaml",
                                                                                           "env.SBATCH_TIMELIMIT"]),
    Refused("env-srun-reserved", {"exp.yaml": exp("env: {SRUN_CPUS_PER_TASK: '5'}\n")}, [], ["exp.yaml",
                                                                                            "env.SRUN_CPUS_PER_TASK"]),
    Refused("env-salloc-reserved", {"exp.yaml": exp("env: {SALLOC_PARTITION: x}\n")}, [], ["exp.yaml",
                                                                                         "env.SALLOC_PARTITION"]),
    Refused("env-bash-variable", {"exp.yaml": exp("env: {BASH_ENV: /tmp/x}\n")}, [], ["exp.yaml", "env.BASH_ENV"]),
    Refused("override-env-reserved", {"exp.yaml": EXP}, ["env.SLURM_NODEID=0"], ["command line", "env.SLURM_NODEID"]),
    # --- interpolation ---
    Refused("run-value-unknown", {"exp.yaml": entry("{script: train.py, args: ['--out=${run:out}']}")},
            [], ["exp.yaml", "entrypoint.args[0]", "${run:out} is not a run-scoped value",
                 "dir, id, checkpoint_dir, restart"]),
    Refused("run-value-unknown-in-env", {"exp.yaml": exp("env: {OUT: '${run:directory}/x'}\n")}, [],
            ["exp.yaml", "env.OUT", "${run:directory} is not a run-scoped value"]),
    Refused("run-value-where-none-is-filled-in", {"exp.yaml": QUIET_EXP + "hparams: {out: '${run:dir}'}\n"}, [],
            ["exp.yaml:5: hparams.out", "filled in on the node at each start",
             "only in entrypoint.args, entrypoint.resume_args and env values"]),
    Refused("run-value-in-checkpoint-dir", {"exp.yaml": QUIET_EXP + "checkpoint: {dir: '${run:dir}/ck'}\n"}, [],
            ["exp.yaml:5: checkpoint.dir", "filled in on the node at each start"]),
    Refused("resume-args-not-a-list", {"exp.yaml": entry("{script: train.py, resume_args: --resume}")},
            [], ["exp.yaml", "entrypoint.resume_args", "must be a list"]),
    Refused("progress-without-pattern", {"exp.yaml": entry("{script: train.py, progress: {total: 5}}")},
            [], ["exp.yaml", "entrypoint.progress.pattern"]),
    Refused("progress-pattern-without-group",
            {"exp.yaml": entry("{script: train.py, progress: {pattern: '^iter \\d+'}}")},
            [], ["exp.yaml", "entrypoint.progress.pattern", "needs a group for the step"]),
    Refused("progress-pattern-not-a-regex",
            {"exp.yaml": entry("{script: train.py, progress: {pattern: '^iter (\\d+'}}")},
            [], ["exp.yaml", "entrypoint.progress.pattern", "not a regular expression"]),
    Refused("progress-total-zero",
            {"exp.yaml": entry("{script: train.py, progress: {pattern: '(\\d+)', total: 0}}")},
            [], ["exp.yaml", "entrypoint.progress.total"]),
    Refused("bad-interpolation", {"exp.yaml": exp("env: {A: '${nosuch.key}'}\n")}, [], ["exp.yaml", "env.A"]),
    Refused("interpolation-unclosed", {"exp.yaml": exp("env: {A: '${resources.nodes'}\n")}, [], ["exp.yaml", "env.A",
                                                                                               "unclosed"]),
    Refused("interpolation-loop", {"exp.yaml": exp("env: {A: '${env.B}', B: '${env.A}'}\n")}, [], ["exp.yaml", "env.A"]),
    Refused("interpolation-cycle", {"exp.yaml": QUIET_EXP + "hparams: {a: '${hparams.b}', b: '${hparams.a}'}\n"}, [],
            ["hparams.a", "refers to itself"], not_in=["literal shell variable"]),   # that hint is for names not found
    Refused("unparsable-interpolation-empty", {"exp.yaml": QUIET_EXP + "hparams: {a: '${}'}\n"}, [],
            ["exp.yaml:5: hparams.a", "is not an interpolation"], not_in=["cannot interpolate"]),
    Refused("unparsable-interpolation-space", {"exp.yaml": QUIET_EXP + "hparams: {a: '${ }'}\n"}, [],
            ["exp.yaml:5: hparams.a", "is not an interpolation"], not_in=["cannot interpolate"]),
    Refused("unparsable-interpolation-bash-default-in-env",
            {"exp.yaml": QUIET_EXP + "env: {A: '${HOME:-$(touch PWNED)}'}\n"}, [],
            ["exp.yaml:5: env.A", "is not an interpolation"], not_in=["cannot interpolate"]),
    Refused("unparsable-interpolation-bash-default-in-args",
            {"exp.yaml": QUIET_EXP.replace("entrypoint: {script: train.py}\n", "")
             + "entrypoint: {script: train.py, args: ['${x:-$(touch PWNED)}']}\n"}, [],
            ["entrypoint.args[0]", "is not an interpolation"], not_in=["cannot interpolate"]),
    Refused("unparsable-interpolation-override", {"exp.yaml": QUIET_EXP}, ["hparams.a=${a b}"],
            ["command line: hparams.a", "is not an interpolation"]),
    Refused("unparsable-interpolation-in-the-site", {"exp.yaml": QUIET_EXP, "site_configs/mysite.yaml":
                                                     SITE + "account: '${}'\n"}, [],
            ["mysite.yaml:7: account", "is not an interpolation"]),
    # --- overrides: KEY=VALUE, no sections where a value goes, no empty choice ---
    Refused("override-no-equals", {"exp.yaml": EXP}, ["resources.nodes"], ["command line", "resources.nodes"]),
    Refused("override-unknown-key", {"exp.yaml": EXP}, ["resources.nodez=3"], ["command line", "resources.nodez"]),
    Refused("override-wrong-type", {"exp.yaml": EXP}, ["resources.nodes=many"], ["command line", "resources.nodes"]),
    Refused("override-mapping-into-env", {"exp.yaml": EXP}, ["env.A={x: 1}"], ["command line", "env.A", "single value"]),
    Refused("override-list-into-env", {"exp.yaml": EXP}, ["env.A=[1, 2]"], ["command line", "env.A", "single value"]),
    Refused("override-mapping-into-time", {"exp.yaml": EXP}, ["resources.time={h: 1}"], ["command line", "resources.time"]),
    Refused("override-list-into-nodes", {"exp.yaml": EXP}, ["resources.nodes=[2]"], ["command line", "resources.nodes"]),
    Refused("override-scalar-into-env", {"exp.yaml": EXP}, ["env=A"], ["command line", "env", "mapping"]),
    # An interpolation in an unquoted flow list parses (see test_unquoted_list_with_an_interpolation); a list
    # that is no YAML flow list is said to be one, with how to quote its items.
    Refused("override-list-unclosed-interpolation", {"exp.yaml": QUIET_EXP},
            ["entrypoint.args=[--lr,${hparams.lr]"],
            ["command line: entrypoint.args", "not a YAML flow list", "quote"]),
    Refused("override-list-unclosed-bracket", {"exp.yaml": QUIET_EXP}, ["entrypoint.args=[--lr,${hparams.lr}"],
            ["command line: entrypoint.args", "not a YAML flow list", "quote"]),
    # YAML's own word on why, and for a backslash in double quotes, how to keep it.
    Refused("override-list-yaml-problem", {"exp.yaml": QUIET_EXP}, ["entrypoint.args=[a, b"],
            ["command line: entrypoint.args", "not a YAML flow list (YAML: did not find expected ',' or ']'"]),
    Refused("override-mapping-escape", {"exp.yaml": QUIET_EXP}, ['env={A: "\\d"}'],
            ["command line: env", "not a YAML flow mapping (found unknown escape character): in double quotes a "
             "backslash starts an escape; an item in single quotes keeps it as written"]),
    Refused("override-list-escape", {"exp.yaml": QUIET_EXP}, ['entrypoint.args=["\\x4"]'],
            ["command line: entrypoint.args", "(did not find expected hexdecimal number): in double quotes"]),
    Refused("override-int-as-float", {"exp.yaml": QUIET_EXP}, ["checkpoint.every_steps=1e3"],
            ["command line: checkpoint.every_steps: must be a whole number, got 1e3 (written as a float; write 1000)"]),
    # `checkpoint.dir=$CKPT` with CKPT unset must not quietly mean the default.
    *[Refused(f"empty-choice-{override.split('=')[0]}{'-blank' if override.endswith(' ') else ''}",
              {"exp.yaml": QUIET_EXP}, [override], [f"command line: {override.split('=')[0]}", "leave it out"])
      for override in ["resources.partition=", "checkpoint.dir=", "checkpoint.dir= ", "strategy.nvme_path=",
                       "model.factory="]],
    # --- finding the site ---
    Refused("unknown-site", {"exp.yaml": EXP}, ["--site", "nosuch"], ["command line", "site", "nosuch"]),
    Refused("unknown-site-in-exp", {"exp.yaml": exp("site: nosuch\n")}, [], ["exp.yaml", "site", "nosuch"], site=None),
    Refused("unknown-site-of-the-experiment", {"exp.yaml": QUIET_EXP.replace("requeue:", "site: nowhere\nrequeue:")},
            [], ["exp.yaml:4: site: unknown site 'nowhere'"], not_in=["extends"], site=None),
    Refused("site-option-no-name", {"exp.yaml": QUIET_EXP}, ["--site", "a b"],
            ["--site: 'a b' is not a site name or a path"]),
    Refused("site-file-missing", {"exp.yaml": EXP}, ["--site", "./missing.yaml"], ["missing.yaml", "not found"]),
    # A name or path no file system takes (ENAMETOOLONG) is refused, never stat()ed into a traceback.
    Refused("site-name-too-long", {"exp.yaml": QUIET_EXP}, ["--site", "s" * 300],
            ["command line: --site", "300 characters"]),
    Refused("site-path-component-too-long", {"exp.yaml": QUIET_EXP}, ["--site", "./" + "s" * 300 + "/x.yaml"],
            ["--site", "File name too long"]),
    Refused("site-default-partition-newline", {"exp.yaml": QUIET_EXP,
                                               "site_configs/mysite.yaml": "name: mysite\nscheduler: slurm\n"
                                                                           "default_partition: \"a\\nb\"\n"},
            ["resources.gpus_per_node=1"], ["mysite.yaml:3: default_partition", "partition name"]),
    # --- the site profile's schema and its extends chain ---
    Refused("site-unknown-key", {"site_configs/mysite.yaml": site("colour: red\n")}, [], ["mysite.yaml", "colour"]),
    Refused("site-partition-unknown-key", {"site_configs/mysite.yaml": SITE.replace("max_nodes: 8", "max_node: 8")}, [],
            ["mysite.yaml", "partitions.gpu.max_node"]),
    Refused("site-missing-gpus", {"site_configs/mysite.yaml": site("  big: {max_nodes: 2}\n")}, [],
            ["mysite.yaml", "partitions.big.gpus_per_node"]),
    Refused("site-bad-scheduler", {"site_configs/mysite.yaml": SITE.replace("scheduler: slurm", "scheduler: pbs")}, [],
            ["mysite.yaml", "scheduler", "slurm, local"]),
    Refused("site-bad-directive", {"site_configs/mysite.yaml": site("gpu_directive: gpus\n")}, [],
            ["mysite.yaml", "gpu_directive"]),
    Refused("site-bad-container", {"site_configs/mysite.yaml": site("container: {runtime: docker, image: x}\n")}, [],
            ["mysite.yaml", "container.runtime"]),
    Refused("site-bad-default-partition", {"site_configs/mysite.yaml": SITE.replace("default_partition: gpu",
                                                                                    "default_partition: nope")}, [],
            ["mysite.yaml", "default_partition", "nope"]),
    Refused("site-bad-max-time", {"site_configs/mysite.yaml": SITE.replace('"1-00:00:00"', '"forever"')}, [],
            ["mysite.yaml", "partitions.gpu.max_time"]),
    Refused("site-max-time-48h", {"site_configs/mysite.yaml": SITE.replace('"1-00:00:00"', "48h")}, [],
            ["mysite.yaml", "partitions.gpu.max_time", "not a time"]),
    Refused("site-max-time-unused-partition", {"site_configs/mysite.yaml": SITE.replace("max_nodes: 4}", "max_nodes: 4, "
                                                                                        "max_time: '00:90:00'}")}, [],
            ["mysite.yaml", "partitions.cpu.max_time"]),
    Refused("site-sbatch-nested", {"site_configs/mysite.yaml": site("sbatch: {mail: {a: 1}}\n")}, [],
            ["mysite.yaml", "sbatch.mail"]),
    Refused("site-preemptible-yes", {"site_configs/mysite.yaml": SITE.replace("max_nodes: 4", "max_nodes: 4, "
                                                                              "preemptible: yes")}, [],
            ["mysite.yaml", "partitions.cpu.preemptible", "true or false"]),
    Refused("site-gpu-mem-nan", {"site_configs/mysite.yaml": SITE.replace("gpu_mem_gb: 80", "gpu_mem_gb: .nan")}, [],
            ["mysite.yaml", "partitions.gpu.gpu_mem_gb", "finite"]),
    Refused("site-mem-inf", {"site_configs/mysite.yaml": SITE.replace("mem_gb: 256", "mem_gb: .inf")}, [],
            ["mysite.yaml", "partitions.gpu.mem_gb", "finite"]),
    Refused("site-plan-nan", {"site_configs/mysite.yaml": site("plan: {headroom: .nan}\n")}, [],
            ["mysite.yaml", "plan.headroom", "finite"]),
    Refused("site-failure-rate-zero", {"site_configs/mysite.yaml": site("goodput: {failures_per_node_hour: 0}\n")},
            [], ["mysite.yaml", "goodput.failures_per_node_hour", "above 0"]),
    Refused("site-failure-rate-text", {"site_configs/mysite.yaml": site("goodput: {failures_per_node_hour: often}\n")},
            [], ["mysite.yaml", "goodput.failures_per_node_hour"]),
    Refused("site-failure-rate-plan", {"site_configs/mysite.yaml": site("goodput: {failures_per_node_hour: -1e-3}\n")},
            [], ["mysite.yaml", "goodput.failures_per_node_hour", "above 0"], command="plan"),
    Refused("site-name-leading-dash", {"site_configs/mysite.yaml": SITE.replace("name: mysite", "name: -x")}, [],
            ["mysite.yaml", "name"]),
    Refused("partition-leading-dash", {"site_configs/mysite.yaml": site("  -p: {gpus_per_node: 1}\n")}, [],
            ["mysite.yaml", "partitions.-p"]),
    Refused("site-env-reserved", {"site_configs/mysite.yaml": site("env: {SLURM_JOB_ID: '1'}\n")}, [],
            ["mysite.yaml", "env.SLURM_JOB_ID"]),
    Refused("site-env-glaunch", {"site_configs/mysite.yaml": site("env: {GLAUNCH_RUN_DIR: /x}\n")}, [],
            ["mysite.yaml", "env.GLAUNCH_RUN_DIR"]),
    Refused("site-duplicate-key", {"site_configs/mysite.yaml": site("partitions:\n  gpu: {gpus_per_node: 8}\n")}, [],
            ["mysite.yaml:7", "partitions", "lines 4 and 7"]),
    Refused("site-duplicate-partition-key", {"site_configs/mysite.yaml": SITE.replace("max_nodes: 8", "max_nodes: 8, "
                                                                                     "max_nodes: 16")}, [],
            ["mysite.yaml", "partitions.gpu.max_nodes", "duplicate key"]),
    Refused("parent-duplicate-key", {"site_configs/mysite.yaml": site("extends: base\n"),
                                     "site_configs/base.yaml": "name: base\nqos: a\nqos: b\n"}, [],
            ["base.yaml:3", "qos", "lines 2 and 3"]),
    Refused("extends-self", {"site_configs/mysite.yaml": site("extends: mysite\n")}, [], ["mysite.yaml", "extends",
                                                                                         "cycle"]),
    Refused("extends-cycle", {"site_configs/mysite.yaml": site("extends: other\n"),
                              "site_configs/other.yaml": "name: other\nextends: mysite\n"}, [],
            ["extends", "cycle", "other.yaml"]),
    Refused("extends-unknown", {"site_configs/mysite.yaml": site("extends: nosuchbase\n")}, [],
            ["mysite.yaml", "extends", "nosuchbase"]),
    Refused("extends-bad-type", {"site_configs/mysite.yaml": site("extends: {a: 1}\n")}, [], ["mysite.yaml", "extends"]),
    Refused("extends-too-deep", {"site_configs/mysite.yaml": site("extends: s0\n"), **{
               f"site_configs/s{i}.yaml": f"name: s{i}\nextends: s{i + 1}\n" for i in range(100)}}, [],
            ["extends chain is deeper than"]),
    Refused("parent-bad-value", {"site_configs/mysite.yaml": site("extends: base\n"),
                                 "site_configs/base.yaml": "name: base\nqos: [1, 2]\n"}, [], ["base.yaml", "qos"]),
    Refused("unknown-parent", {"exp.yaml": QUIET_EXP, "site_configs/child.yaml": "extends: nowhere\nname: child\n"},
            ["--site", "child"], ["child.yaml:1: extends: unknown site 'nowhere'"]),
    # --- profile checks `sites validate` shares with `submit`: sbatch extras ---
    Refused("site-sbatch-owned-directive", {"site_configs/mysite.yaml": site("sbatch: {nodes: 64}\n")}, [],
            ["mysite.yaml", "sbatch.nodes", "written by glaunch"]),
    Refused("site-sbatch-owned-output", {"site_configs/mysite.yaml": site("sbatch: {output: /tmp/x}\n")}, [],
            ["mysite.yaml", "sbatch.output"]),
    Refused("site-sbatch-newline", {"site_configs/mysite.yaml": site("sbatch: {comment: \"a\\nb\"}\n")}, [],
            ["mysite.yaml", "sbatch.comment", "one line"]),
    Refused("site-account-escape", {"site_configs/mysite.yaml": site("account: \"a\\eb\"\n")}, [],
            ["mysite.yaml", "account", "control characters"]),
    Refused("site-python-unbalanced", {"site_configs/mysite.yaml": site("python: \"python3 'x\"\n")}, [],
            ["mysite.yaml", "python", "not a command line"]),
    *[Refused(f"sbatch-own-{key}", one_partition_site(f"sbatch: {{{key}: x}}\n"), [], ["mysite.yaml", f"sbatch.{key}"])
      for key in sorted(OWN_SBATCH_OPTIONS)],
    *[Refused(f"sbatch-abbreviates-{own}", one_partition_site(f"sbatch: {{{key}: x}}\n"), [],
              [f"sbatch.{key}", f"--{own}"])
      for key, own in [("parti", "partition"), ("ti", "time"), ("nod", "nodes"), ("out", "output"),
                       ("acc", "account"), ("signa", "signal"), ("gpus-per-n", "gpus-per-node")]],
    *[Refused(f"sbatch-{option}", {"exp.yaml": QUIET_EXP, "site_configs/mysite.yaml": SITE + f"sbatch: {{{option}: NONE}}\n"},
              [], [f"mysite.yaml:{len(SITE.splitlines()) + 1}: sbatch.{option}:", why])
      for option, why in [("export", "srun inside the job inherits the job's environment"),
                          ("test-only", "nothing would ever be queued"),
                          ("wait", "block glaunch submit until the job ended"),
                          ("expo", "abbreviation of --export")]],
    # --- containers, modules, setup lines, python ---
    *[Refused(f"mount-{name}", one_partition_site(PYXIS % mounts), [], ["mysite.yaml", key])
      for name, mounts, key in [
          ("comma", "'/a,/b'", "container.mounts[0]"), ("four-fields", "'/a:/b:ro:x'", "container.mounts[0]"),
          ("relative", "'rel:/b'", "container.mounts[0]"), ("variable", "'$SCRATCH:/scratch'", "container.mounts[0]"),
          ("empty-target", "'/a:'", "container.mounts[0]"), ("second", "/ok, '/a:b'", "container.mounts[1]")]],
    *[Refused(f"image-{name}", one_partition_site(f"container: {{runtime: apptainer, image: {json.dumps(image)}}}\n"),
              [], ["container.image"])
      for name, image in [("dash", "-rm"), ("space", "a b"), ("comma", "a,b"), ("empty", ""), ("escape", "x\x1by")]],
    *[Refused(f"module-{name}", one_partition_site(f"modules: [ok/1, {json.dumps(module)}]\n"), [], ["modules[1]"])
      for name, module in [("dash", "-f"), ("space", "a b"), ("semicolon", "x;y"), ("substitution", "$(id)"),
                           ("empty", ""), ("newline", "cuda\n12")]],
    *[Refused(f"setup-{name}", one_partition_site(f"setup: [{json.dumps(line)}]\n"), [], ["setup[0]"])
      for name, line in [("escape", "echo \x1b[31m"), ("carriage-return", "a\rb"), ("csi", "x\x9by"),
                         ("bell", "bell\x07")]],
    *[Refused(f"python-{name}", one_partition_site(f"python: {json.dumps(python)}\n"), [], ["python"])
      for name, python in [("option-first", "-c x"), ("empty-program", "'' -u"), ("bracket", "'py]'"),
                           ("tab", "'a\\tb'")]],
]


def dry_run(**kwargs):
    return api.submit("exp.yaml", dry_run=True, runs_dir="runs", **kwargs)


CALLS = [
    RefusedCall("sites-show-not-a-name", lambda: api.sites("a b"), "SITE"),
    *[RefusedCall(f"site-{type(value).__name__}", lambda value=value: dry_run(site=value), "--site",
                  check=lambda error, value=value: type(value).__name__ in error.message)
      for value in [123, 1.5, ["mysite"], b"mysite"]],
    *[RefusedCall(f"override-item-{name}", lambda value=value: api.submit("exp.yaml", site="mysite", overrides=value,
                                                                         dry_run=True), None, [fragment])
      for name, value, fragment in [("int", [4], "override 4 is not KEY=VALUE text"),
                                    ("none", [None], "override None is not KEY=VALUE text"),
                                    ("bytes", [b"resources.nodes=1"], "it is bytes")]],
    RefusedCall("overrides-one-string-loaded", lambda: load.load_experiment("exp.yaml", "resources.nodes=1"), None,
                ["a list of KEY=VALUE strings"]),
    RefusedCall("overrides-one-string-parsed", lambda: parse_overrides("resources.nodes=1"), None,
                ["a list of KEY=VALUE strings, got the single string"]),
    *[RefusedCall(f"experiment-{name}", lambda value=value: api.prepare(value, site="mysite"), None,
                  ["the experiment must be a YAML file's path"])
      for name, value in [("none", None), ("int", 3)]],
    RefusedCall("name-too-long", lambda: api.submit("exp.yaml", site="mysite", dry_run=True,
                                                    overrides=["name=" + "b" * (MAX_RUN_NAME + 1)]),
                "name", check=lambda error: error.file == "command line"),
]


@table(CASES)
def test_refused(case, tmp_path, monkeypatch, capsys, isolated_env):
    refuse(case, tmp_path, monkeypatch, capsys)


@table(CALLS)
def test_refused_call(case, mysite_workdir):
    refuse_call(case, mysite_workdir)


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40


# --- `glaunch sites validate` applies exactly the checks `submit` applies to a profile ------

SITE_ONLY = [c for c in CASES if set(c.files) <= {"site_configs/mysite.yaml"} and not c.args
             and c.command == "submit" and c.site == "mysite"]


@table(SITE_ONLY)
def test_sites_validate_refuses_what_submit_refuses(case, tmp_path, monkeypatch, capsys, isolated_env):
    monkeypatch.chdir(tmp_path)
    write_files(tmp_path, {"exp.yaml": EXP, "site_configs/mysite.yaml": SITE, **case.files})
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "validate", "mysite"])
    assert code == 2, (out, err)
    assert "Traceback" not in out + err
    for fragment in case.fragments:
        assert fragment in err, f"{fragment!r} not in {err!r}"


def test_sites_validate_passes_every_shipped_profile(monkeypatch, capsys, isolated_env):
    from launcher.config.sites import SHIPPED_SITES

    names = sorted(p.stem for p in SHIPPED_SITES.glob("*.yaml"))
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "validate", *names])
    assert code == 0, (out, err)
    assert out.count("ok ") == len(names)


def test_sites_validate_reports_bad_profile(tmp_path, monkeypatch, capsys, isolated_env):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\npartitions: {gpu: {gpus_per_node: four}}\n")
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "validate", str(bad), "local"])
    assert code == 2
    assert "bad.yaml" in err and "partitions.gpu.gpus_per_node" in err


def test_own_directive_error_names_the_profile_key_to_use(tmp_path, isolated_env):
    import dataclasses

    from launcher.config.sitechecks import check_site

    (tmp_path / "good.yaml").write_text(ONE_PARTITION_SITE)
    loaded = load_site(str(tmp_path / "good.yaml"), tmp_path, {})
    for key, instead in [("time", "resources.time"), ("nodes", "resources.nodes"), ("mem", "resources.mem_gb"),
                         ("gres", "resources.gpus_per_node"), ("signal", "requeue.signal_lead_s"),
                         ("tasks-per-node", "launcher"), ("array", "--sweep")]:
        site = dataclasses.replace(loaded.config, sbatch={key: "1"})
        with pytest.raises(ConfigError) as info:
            check_site(site)
        assert info.value.key == f"sbatch.{key}" and instead in info.value.message


# --- what the checks let through --------------------------------------------------------------

def accepted(root, monkeypatch, capsys, *args, exp_extra="", site_extra="") -> dict[str, str]:
    """The bundle's files of `glaunch submit exp.yaml --site mysite --dry-run --json`, run in
    `root` on EXP + exp_extra and ONE_PARTITION_SITE + site_extra: it must pass."""
    monkeypatch.chdir(root)
    write_files(root, {"train.py": "", "exp.yaml": EXP + exp_extra,
                       "site_configs/mysite.yaml": ONE_PARTITION_SITE + site_extra})
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "mysite", "--dry-run",
                                                   "--json", "--runs-dir", str(root / "runs"), *args])
    assert code == 0, err
    run_dir = Path(json.loads(out)["run_dir"])
    return {p.name: p.read_text() for p in run_dir.iterdir() if p.is_file()}


def test_resolver_warnings_do_not_reach_stderr(mysite_workdir, isolated_env):
    """In a process of its own: pytest would capture the Python warning itself."""
    (mysite_workdir / "exp.yaml").write_text(QUIET_EXP + "hparams: {a: '${oc.deprecated:name}'}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "mysite",
                           "--dry-run"], cwd=mysite_workdir, env=dict(isolated_env, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_longest_name_renders(mysite_workdir, monkeypatch, capsys):
    (mysite_workdir / "exp.yaml").write_text(QUIET_EXP.replace("name: good", "name: " + "a" * MAX_RUN_NAME))
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "mysite", "--dry-run"])
    assert code == 0, err


def test_longest_name_sweeps(mysite_workdir, monkeypatch, capsys):
    """A sweep adds the most to a run name: its elements' directories must still be creatable."""
    (mysite_workdir / "exp.yaml").write_text(QUIET_EXP.replace("name: good", "name: " + "a" * MAX_RUN_NAME))
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "mysite", "--dry-run",
                                                   "--sweep", "hparams.lr=1,2"])
    assert code == 0, err


def test_a_path_object_is_a_profile_file_whatever_its_name(mysite_workdir):
    # "plain" has neither '/' nor .yaml: as text it would be looked up as a profile name.
    (mysite_workdir / "plain").write_text(SITE.replace("mysite", "plain"))
    assert dry_run(site=Path("plain")).site == "plain"
    assert dry_run(site=Path("site_configs/mysite.yaml")).site == "mysite"


def test_wait_all_nodes_is_not_taken_for_wait(mysite_workdir):
    with open(mysite_workdir / "site_configs" / "mysite.yaml", "a") as f:
        f.write("sbatch: {wait-all-nodes: 1}\n")
    assert "#SBATCH --wait-all-nodes=1" in (dry_run(site="mysite").run_dir / "job.sbatch").read_text()


def test_sbatch_extras_that_add_are_written(tmp_path, monkeypatch, capsys, isolated_env):
    job = accepted(tmp_path, monkeypatch, capsys,
                   site_extra="sbatch: {exclusive: true, mail-type: END, uenv: 'pytorch/v2.8.0:/user-env', "
                              "comment: 'a \"b\" \\ #c', hint: false}\n")["job.sbatch"]
    assert "#SBATCH --exclusive\n" in job and "#SBATCH --mail-type=END\n" in job
    assert "#SBATCH --uenv=pytorch/v2.8.0:/user-env\n" in job
    assert '#SBATCH --comment="a \\"b\\" \\\\ #c"\n' in job
    assert "--hint" not in job
    # glaunch's own directives are there once each
    for own in ("nodes", "time", "output", "signal"):
        assert job.count(f"#SBATCH --{own}=") == 1


def test_good_mounts_are_kept_whole(tmp_path, monkeypatch, capsys, isolated_env):
    job = accepted(tmp_path, monkeypatch, capsys, site_extra=PYXIS % "/data, '/scratch:/s:ro'")["job.sbatch"]
    mounts = next(w for w in job.split() if w.startswith("--container-mounts="))
    assert mounts.split("=", 1)[1].split(",")[:2] == ["/data", "/scratch:/s:ro"]


def test_module_names_modules_use_are_accepted(tmp_path, monkeypatch, capsys, isolated_env):
    names = ["cuda/12.4", "Stages/2024", "py-torch@2.1.0%gcc", "gcc+cuda", "nvidia/nvhpc-hpcx-cuda12/24.3"]
    env_sh = accepted(tmp_path, monkeypatch, capsys, site_extra=f"modules: {json.dumps(names)}\n")["env.sh"]
    for name in names:
        assert f"module load {name}\n" in env_sh


def test_setup_lines_keep_tabs_and_newlines(tmp_path, monkeypatch, capsys, isolated_env):
    line = "if true; then\n\techo ok\nfi"
    assert line in accepted(tmp_path, monkeypatch, capsys, site_extra=f"setup: [{json.dumps(line)}]\n")["env.sh"]


# --- directories from the environment: an error names the variable, never a traceback ------

LONG_DIR = "/" + "d" * 300            # one component over NAME_MAX (ENAMETOOLONG)

ENV_CASES = [
    (Refused("site-path-too-long", {"exp.yaml": QUIET_EXP}, [], ["GLAUNCH_SITE_PATH", "File name too long"],
             site="nosuch"), {"GLAUNCH_SITE_PATH": LONG_DIR}),
    (Refused("site-path-too-long-after-a-good-one", {"exp.yaml": QUIET_EXP}, [],
             ["GLAUNCH_SITE_PATH", "File name too long"], site="nosuch"), {"GLAUNCH_SITE_PATH": "/tmp:" + LONG_DIR}),
    (Refused("home-too-long", {"exp.yaml": QUIET_EXP}, [], ["HOME", "File name too long"], site="nosuch"),
     {"HOME": LONG_DIR}),
    (Refused("sites-list-site-path-too-long", {}, ["sites", "list"], ["GLAUNCH_SITE_PATH", "File name too long"],
             command=None), {"GLAUNCH_SITE_PATH": LONG_DIR}),
]


@pytest.mark.parametrize("case, environ", ENV_CASES, ids=[case.id for case, _ in ENV_CASES])
def test_refused_for_the_environment(case, environ, tmp_path, monkeypatch, capsys, isolated_env):
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    refuse(case, tmp_path, monkeypatch, capsys)


def test_a_site_path_directory_that_does_not_exist_is_skipped(mysite_workdir, monkeypatch):
    monkeypatch.setenv("GLAUNCH_SITE_PATH", str(mysite_workdir / "nosuch") + ":" + str(mysite_workdir / "train.py"))
    assert dry_run(site="mysite").site == "mysite"


# --- overrides holding interpolations -------------------------------------------------------

def test_unquoted_list_with_an_interpolation(tmp_path, monkeypatch, capsys, isolated_env):
    """`${...}` holds '{' and '}', YAML flow indicators: unquoted in a flow list it is still one item."""
    job = accepted(tmp_path, monkeypatch, capsys, "hparams.lr=0.5",
                   "entrypoint.args=[--steps,20,--lr,${hparams.lr},--tag=${name}-x, ${oc.env:HOME,${hparams.lr}}]")
    assert "--steps 20 --lr 0.5 --tag=good-x " in job["job.sbatch"]
    assert str(tmp_path / "home") in job["job.sbatch"]


def test_quoted_and_unquoted_interpolations_give_the_same_list():
    from launcher.config.yamlfile import Scalar, override_value

    assert override_value("[--lr, ${hparams.lr}]") == [Scalar("--lr"), Scalar("${hparams.lr}")]
    assert override_value("[--lr, '${hparams.lr}']") == [Scalar("--lr"), Scalar("${hparams.lr}", plain=False)]
    assert override_value("{a: ${x}, b: [${y.z}]}") == {"a": Scalar("${x}"), "b": [Scalar("${y.z}")]}
    assert override_value("[a, ${b]") == Scalar("[a, ${b]")          # no list: the type check says why
