"""The plain load path and the OmegaConf one agree on every input: the same objects, or
the same error. `load` takes the plain path only for input it can decide alone (no `${`,
no `???`, values already of their field's type) and hands everything else, errors
included, to OmegaConf; these tests keep the two from drifting apart."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import test_bad_input_table as table
from launcher import cli
from launcher.config import load, schema, sites, typed
from launcher.errors import ConfigError
from launcher import schedulers
from launcher.resolution.jobplan import SubmitContext
from launcher.resolution.resolve import resolve

REPO = Path(__file__).resolve().parent.parent
ENVIRON = {"HOME": "/home/alice", "USER": "alice", "SCRATCH": "/scratch/alice", "WORK": "/work/alice",
           "SCRATCHDIR": "/scratchdir/alice", "PROJECT": "/project/p1"}
SHIPPED = sorted(p.stem for p in sites.SHIPPED_SITES.glob("*.yaml"))
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))


def _outcome(fn):
    """What a load returns or raises, in a form that tells 1, 1.0, True and '1' apart."""
    try:
        result = fn()
    except ConfigError as exc:
        return ("ConfigError", str(exc), exc.file, exc.key, exc.line)
    except Exception as exc:  # whatever OmegaConf lets through, the plain path must match
        return (type(exc).__name__, str(exc))
    return ("ok", repr(result))


def both_paths(monkeypatch, fn):
    """(outcome on the plain path, outcome through OmegaConf, whether OmegaConf was needed)."""
    used = []
    real = typed._typed_config_omegaconf

    def spy(*args, **kwargs):
        used.append(args[0].__name__)
        return real(*args, **kwargs)

    monkeypatch.setattr(typed, "_typed_config_omegaconf", spy)
    monkeypatch.setattr(typed, "PLAIN_PATH", True)
    plain = _outcome(fn)
    needed_omegaconf = bool(used)
    monkeypatch.setattr(typed, "PLAIN_PATH", False)
    slow = _outcome(fn)
    return plain, slow, needed_omegaconf


def test_missing_is_omegaconfs():
    import omegaconf

    assert schema.MISSING == omegaconf.MISSING


# --- shipped profiles and examples: all plain, and the same objects -----------------------


@pytest.mark.parametrize("site", SHIPPED)
def test_shipped_sites_agree_on_the_plain_path(site, monkeypatch):
    plain, slow, needed = both_paths(monkeypatch, lambda: load.load_site(site, Path("/nonexistent"), ENVIRON))
    assert plain == slow
    assert plain[0] == "ok" and not needed


OVERRIDE_SETS = [
    [], ["resources.nodes=4"], ["launcher=torchrun"], ["env.NEW_VAR=x", "env.OTHER=3"],
    ["entrypoint.args=[a,b]"], ["entrypoint.args=[]"], ["deepspeed.train_batch_size=8"],
    ["deepspeed.zero_optimization.stage=3", "strategy.name=deepspeed"], ["resources.time=04:00:00"],
    ["resources.mem_gb=100", "model.params=7.5e9"], ["precision=bf16", "batch.micro_size=2"],
    ["checkpoint.dir=/scratch/$USER/ck"], ["name=other-name", "site=local"],
]


@pytest.mark.parametrize("overrides", OVERRIDE_SETS, ids=lambda o: " ".join(o) or "none")
@pytest.mark.parametrize("example", EXAMPLES)
def test_examples_agree_on_the_plain_path(example, overrides, monkeypatch):
    plain, slow, needed = both_paths(monkeypatch, lambda: load.load_experiment(REPO / "examples" / example,
                                                                              overrides))
    assert plain == slow
    assert plain[0] == "ok" and not needed


def _render(example: str, site: str, overrides: list[str]) -> dict[str, str]:
    exp = load.load_experiment(REPO / "examples" / example, overrides)
    exp = dataclasses.replace(exp, path=Path("/home/alice/exp") / example)
    loaded = load.load_site(site, Path("/nonexistent"), ENVIRON)
    ctx = SubmitContext(cwd="/home/alice/exp", python="/usr/bin/python3", environ=ENVIRON,
                        run_id="x-20260101-000000-abcd")
    plan = resolve(exp, loaded, ctx)
    return schedulers.get(plan.scheduler).render(plan)


@pytest.mark.parametrize("site", SHIPPED)
@pytest.mark.parametrize("example", EXAMPLES)
def test_rendered_bundles_agree(example, site, monkeypatch):
    overrides = [] if site in ("local", "local-slurm") else ["resources.nodes=2"]
    plain, slow, _ = both_paths(monkeypatch, lambda: _render(example, site, overrides))
    assert plain == slow


# --- edge inputs: conversions, interpolation, escapes, missing values, errors -------------

EXP = "name: edge\nentrypoint: {script: train.py}\n"
EXPERIMENTS = [
    # (id, yaml appended to EXP (the whole file when it starts with `#`), overrides,
    #  whether the plain path decides it: None when either is right)
    ("plain", "", [], True),
    ("int-in-str-field", "resources: {time: 30}\n", [], True),
    ("numbers-and-bools-in-env", "env: {A: 1, B: 2.5, C: true, D: '$USER'}\n", [], True),
    ("numbers-in-args", "# whole\nname: edge\nentrypoint: {script: train.py, args: [1, 2.5, false, '--x']}\n", [], True),
    ("int-in-float-field", "resources: {mem_gb: 100}\nmodel: {params: 7}\n", [], True),
    ("float-params", "model: {params: 7.5e9}\n", [], True),
    ("huge-int-in-float-field", "model: {params: " + "1" * 400 + "}\n", [], None),
    ("inf-in-float-field", "model: {params: .inf}\n", [], True),
    ("deepspeed-nested", "deepspeed: {zero_optimization: {stage: 2, x: [1, 2.5, {a: b}]}, n: null}\n",
     [], True),
    ("deepspeed-int-key", "deepspeed: {1: a}\n", [], None),
    ("deepspeed-date", "deepspeed: {d: 2024-01-01}\n", [], None),
    ("deepspeed-interpolation", "deepspeed: {train_batch_size: '${batch.micro_size}'}\n", [], False),
    ("name-int", "# whole\nname: 123\nentrypoint: {script: train.py}\n", [], True),
    ("name-date", "# whole\nname: 2024-01-01\nentrypoint: {script: train.py}\n", [], None),
    ("name-missing-literal", "# whole\nname: '???'\nentrypoint: {script: train.py}\n", [], False),
    ("name-escaped-missing", "# whole\nname: '\\???'\nentrypoint: {script: train.py}\n", [], False),
    ("name-ends-in-missing", "# whole\nname: 'a???'\nentrypoint: {script: train.py}\n", [], False),
    ("missing-name", "# whole\nentrypoint: {script: train.py}\n", [], False),
    ("nodes-bool", "resources: {nodes: true}\n", [], False),
    ("nodes-string-int", "resources: {nodes: '2'}\n", [], False),
    ("nodes-string-spaces", "resources: {nodes: ' 2 '}\n", [], False),
    ("nodes-string-word", "resources: {nodes: two}\n", [], False),
    ("nodes-float", "resources: {nodes: 2.0}\n", [], False),
    ("nodes-null", "resources: {nodes: null}\n", [], False),
    ("gpus-null", "resources: {gpus_per_node: null}\n", [], True),
    ("section-null", "resources: null\n", [], False),
    ("env-null", "env: null\n", [], False),
    ("env-value-null", "env: {A: null}\n", [], False),
    ("env-int-key", "env: {1: a}\n", [], False),
    ("env-list-value", "env: {A: [1]}\n", [], False),
    ("args-null-item", "# whole\nname: edge\nentrypoint: {script: train.py, args: [null]}\n", [], False),
    ("args-dict-item", "# whole\nname: edge\nentrypoint: {script: train.py, args: [{a: b}]}\n", [], False),
    ("mem-string-float", "resources: {mem_gb: '1.5'}\n", [], False),
    ("mem-bool", "resources: {mem_gb: true}\n", [], False),
    ("unknown-key", "colour: red\n", [], False),
    ("unknown-nested-key", "batch: {micro: 2}\n", [], False),
    ("bad-choice", "launcher: mpirun\n", [], True),
    ("choice-as-int", "strategy: {name: 3}\n", [], True),
    ("bad-choice-and-missing", "# whole\nname: '???'\nentrypoint: {script: train.py}\nlauncher: mpirun\n", [], False),
    ("env-home", "checkpoint: {dir: '${oc.env:HOME}/ck'}\n", [], False),
    ("env-reference", "env: {N: '${resources.nodes}', T: 'x-${resources.time}'}\n", [], False),
    ("env-escape", "env: {A: '\\${NAME}', B: 'pre \\${X} post'}\n", [], False),
    ("env-dollar-user", "env: {A: '$USER', B: '${oc.env:USER}'}\n", [], False),
    ("bad-interpolation", "env: {A: '${nosuch.key}'}\n", [], False),
    ("unset-env-var", "env: {A: '${oc.env:GLAUNCH_TEST_UNSET_VAR}'}\n", [], False),
    ("unclosed-interpolation", "env: {A: '${resources.nodes'}\n", [], False),
    ("override-nodes", "", ["resources.nodes=4"], True),
    ("override-nodes-string", "", ["resources.nodes='4'"], False),
    ("override-new-env", "", ["env.NEW=x", "env.N=4"], True),
    ("override-deepspeed", "", ["deepspeed.train_batch_size=8", "deepspeed.a.b=[1,2]"], True),
    ("override-args", "", ["entrypoint.args=[a,b]"], True),
    ("override-interpolation", "", ["env.N=${resources.nodes}"], False),
    ("override-escape", "", ["env.N=\\${HOME}"], False),
    ("override-empty", "", ["resources.partition="], True),
    ("override-unknown", "", ["resources.nodez=3"], False),
    ("override-wrong-type", "", ["resources.nodes=many"], False),
    ("override-section-scalar", "", ["resources=3"], None),
]


@pytest.mark.parametrize("text,overrides,plain_expected", [c[1:] for c in EXPERIMENTS],
                         ids=[c[0] for c in EXPERIMENTS])
def test_edge_experiments_agree(text, overrides, plain_expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/alice")
    monkeypatch.setenv("USER", "alice")
    monkeypatch.delenv("GLAUNCH_TEST_UNSET_VAR", raising=False)
    path = tmp_path / "exp.yaml"
    path.write_text(text if text.startswith("#") else EXP + text)
    plain, slow, needed = both_paths(monkeypatch, lambda: load.load_experiment(path, overrides))
    assert plain == slow
    if plain_expected is not None:
        assert needed == (not plain_expected), plain


SITE = "name: edge\nscheduler: slurm\ndefault_partition: gpu\npartitions:\n  gpu: {gpus_per_node: 4}\n"
SITES = [
    ("plain", "", True),
    ("full-partition", "partitions:\n  gpu: {gpus_per_node: 4, gpu_type: a100, gpu_mem_gb: 80, cpus_per_node: 64,"
     " mem_gb: 512.5, max_nodes: 8, max_time: '2-00:00:00', constraint: x, qos: y, preemptible: true}\n", True),
    ("int-gpu-mem", "partitions:\n  gpu: {gpus_per_node: 4, gpu_mem_gb: 80}\n", True),
    ("preemptible-int", "partitions:\n  gpu: {gpus_per_node: 4, preemptible: 1}\n", False),
    ("preemptible-string", "partitions:\n  gpu: {gpus_per_node: 4, preemptible: 'yes'}\n", False),
    ("gpus-string", "partitions:\n  gpu: {gpus_per_node: '4'}\n", False),
    ("gpus-missing", "partitions:\n  gpu: {gpus_per_node: 4}\n  big: {max_nodes: 2}\n", False),
    ("container-full", "container: {runtime: pyxis, image: 'nvcr.io#x', mounts: [/a, /b]}\n", True),
    ("container-partial", "container: {runtime: pyxis}\n", False),
    ("container-empty", "container: {}\n", False),
    ("container-null", "container: null\n", True),
    ("container-bad-runtime", "container: {runtime: docker, image: x}\n", True),
    ("sbatch", "sbatch: {exclusive: true, mail-type: END, nice: 5, x: null}\n", True),
    ("sbatch-nested", "sbatch: {mail: {a: 1}}\n", True),
    ("modules-numbers", "modules: [cuda/12.4, 3]\n", True),
    ("setup-null-item", "setup: [null]\n", False),
    ("plan-ints", "plan: {headroom: 0, overhead_gb: 3}\n", True),
    ("plan-bool", "plan: {headroom: false}\n", False),
    ("crash-retries-bool", "crash_retries: true\n", False),
    ("runs-root-dollar", "runs_root: '$SCRATCH/x'\n", True),
    ("runs-root-env", "runs_root: '${oc.env:HOME}/runs'\n", False),
    ("env-reference", "env: {SITE_NAME: '${name}', P: '${default_partition}'}\n", False),
    ("env-escape", "env: {A: '\\${SLURM_JOB_ID}'}\n", False),
    ("bad-scheduler", "scheduler: pbs\n", True),
    ("unknown-key", "colour: red\n", False),
    ("partition-unknown-key", "partitions:\n  gpu: {gpus_per_node: 4, max_node: 8}\n", False),
    ("qos-list", "qos: [1, 2]\n", False),
    ("python-int", "python: 3\n", True),
]


@pytest.mark.parametrize("text,plain_expected", [c[1:] for c in SITES], ids=[c[0] for c in SITES])
def test_edge_sites_agree(text, plain_expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/alice")
    path = tmp_path / "edge.yaml"
    path.write_text(SITE + text)
    plain, slow, needed = both_paths(monkeypatch, lambda: load.load_site(str(path), tmp_path, ENVIRON))
    assert plain == slow
    assert needed == (not plain_expected), plain


def test_extends_chain_with_provenance_agrees(tmp_path, monkeypatch):
    (tmp_path / "base.yaml").write_text("name: base\nscheduler: slurm\nenv: {A: '1', B: x}\nmodules: [m1]\n"
                                        "partitions:\n  gpu: {gpus_per_node: 4, max_nodes: 2}\n")
    (tmp_path / "mid.yaml").write_text("name: mid\nextends: base.yaml\nenv: {B: y}\ndefault_partition: gpu\n"
                                       "partitions:\n  gpu: {max_nodes: 8}\n  cpu: {gpus_per_node: 0}\n")
    (tmp_path / "top.yaml").write_text("name: top\nextends: [mid.yaml]\nenv: {C: '3'}\nmodules: [m2]\n")
    plain, slow, needed = both_paths(monkeypatch, lambda: load.load_site("top.yaml", tmp_path, ENVIRON))
    assert plain == slow and plain[0] == "ok" and not needed
    loaded = load.load_site("top.yaml", tmp_path, ENVIRON)
    assert loaded.provenance.of("partitions.gpu.max_nodes", exact=True) == load.Origin(str(tmp_path / "mid.yaml"), 6)
    assert loaded.provenance.of("env.A", exact=True) == load.Origin(str(tmp_path / "base.yaml"), 3)


# --- the bad-input table and the hostile strings, through the whole command -------------


def _run_cli(monkeypatch, capsys, argv):
    monkeypatch.setattr(sys, "argv", argv)
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("files,args,fragments", [c[1:] for c in table.CASES], ids=[c[0] for c in table.CASES])
def test_bad_input_table_agrees(files, args, fragments, tmp_path, monkeypatch, capsys, isolated_env):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GLAUNCH_TEST_UNSET", raising=False)
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "site_configs").mkdir()
    for name, text in {"exp.yaml": table.EXP, "site_configs/mysite.yaml": table.SITE, **files}.items():
        if text is not None:
            (tmp_path / name).write_text(text)
    site_args = [] if ("--site" in args or "--site-from-exp" in args) else ["--site", "mysite"]
    args = [a for a in args if a != "--site-from-exp"]
    argv = ["glaunch", "submit", "exp.yaml", "--dry-run", "--runs-dir", str(tmp_path / "runs"), *site_args, *args]
    results = []
    for plain in (True, False):
        monkeypatch.setattr(typed, "PLAIN_PATH", plain)
        results.append(_run_cli(monkeypatch, capsys, argv))
    assert results[0] == results[1]
    assert results[0][0] == 2


def test_hostile_strings_agree(tmp_path, monkeypatch):
    from test_hostile_strings import HOSTILE

    exp = tmp_path / "exp.yaml"
    exp.write_text(json.dumps({"name": "hostile", "entrypoint": {"script": "seen.py", "args": HOSTILE},
                               "env": {f"V{i}": v for i, v in enumerate(HOSTILE)}}))
    overrides = ["checkpoint.dir=" + str(tmp_path / "ck `touch PWNED5`")]
    plain, slow, needed = both_paths(monkeypatch, lambda: load.load_experiment(exp, overrides))
    assert plain == slow and plain[0] == "ok" and not needed


def test_dry_run_does_not_import_omegaconf(tmp_path):
    """The point of the plain path: a plain dry run never loads OmegaConf."""
    code = ("import sys\nfrom launcher import cli\nsys.argv = ['glaunch', 'submit', 'examples/torch_ddp.yaml', "
            "'--dry-run', '--runs-dir', sys.argv[1], *sys.argv[2:]]\n"
            "try:\n    cli.main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "assert 'omegaconf' not in sys.modules, 'omegaconf was imported'\n")
    env = dict(os.environ, GLAUNCH_STATE_DIR=str(tmp_path / "state"), **ENVIRON)
    for extra in ([], ["--site", "juwels-booster", "resources.nodes=2"]):
        proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "runs"), *extra], cwd=REPO, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
