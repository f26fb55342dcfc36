"""Loading: one set of conversion rules from YAML text to the schema's values.

Every shipped profile and example loads and renders; a table pins what each written
scalar becomes (YAML never retypes `args` and `env` text; typed fields parse by their
type); `${...}` interpolates while an env value's `$NAME`, `${NAME}` and `$$` stay for
the job's shell; and OmegaConf is imported only for a value that interpolates."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import schedulers
from launcher.config import load, sites
from launcher.config.sourcemap import Origin
from launcher.errors import ConfigError
from launcher.resolution.jobplan import SubmitContext
from launcher.resolution.resolve import resolve

REPO = Path(__file__).resolve().parents[2]
ENVIRON = {"HOME": "/home/alice", "USER": "alice", "SCRATCH": "/scratch/alice", "WORK": "/work/alice",
           "SCRATCHDIR": "/scratchdir/alice", "PROJECT": "/project/p1"}
SHIPPED = sorted(p.stem for p in sites.SHIPPED_SITES.glob("*.yaml"))
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.yaml"))


# --- shipped profiles and examples -------------------------------------------------------


@pytest.mark.parametrize("site", SHIPPED)
def test_shipped_site_loads(site):
    loaded = sites.load_site(site, Path("/nonexistent"), ENVIRON)
    assert loaded.config.name == site
    assert loaded.path.parent == sites.SHIPPED_SITES


def _render(example: str, site: str, overrides: list[str]) -> dict[str, str]:
    exp = load.load_experiment(REPO / "examples" / example, overrides)
    exp = dataclasses.replace(exp, path=Path("/home/alice/exp") / example)
    loaded = sites.load_site(site, Path("/nonexistent"), ENVIRON)
    ctx = SubmitContext(cwd="/home/alice/exp", python="/usr/bin/python3", environ=ENVIRON,
                        run_id="x-20260101-000000-abcd")
    plan = resolve(exp, loaded, ctx)
    return schedulers.get(plan.scheduler).render(plan)


@pytest.mark.parametrize("site", [s for s in SHIPPED if s != "base-slurm"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_renders_on_every_site(example, site):
    # Two nodes of the site's GPUs; the global batch follows the world size.
    overrides = [] if site in ("local", "local-slurm") else ["resources.nodes=2", "batch.global_size=null"]
    files = _render(example, site, overrides)
    assert "job.sbatch" in files and "env.sh" in files
    if load.load_experiment(REPO / "examples" / example).config.strategy.name == "deepspeed":
        assert "ds_config.json" in files


def test_base_slurm_is_only_extended():
    with pytest.raises(ConfigError):
        _render("torch_ddp.yaml", "base-slurm", [])


# --- what each written scalar becomes ----------------------------------------------------

EXP = "name: conv\nentrypoint:\n  script: train.py\n"

# (id, YAML lines appended to EXP, overrides, dotted field, expected value). The expected
# value's type is checked too: 1, 1.0, True and '1' are four different results.
CONVERSIONS = [
    # args and env: the text as written, never retyped
    ("args-leading-zero", "  args: [--seed, 0123]\n", [], "entrypoint.args", ["--seed", "0123"]),
    ("args-yaml11-bools", "  args: [on, off, yes, no, y, n, true, False]\n", [], "entrypoint.args",
     ["on", "off", "yes", "no", "y", "n", "true", "False"]),
    ("args-numbers", "  args: [1e3, 0x10, 0o17, 1_000, 1.50, -0, .5, 12:30, 2024-01-01, .inf, .NaN]\n", [],
     "entrypoint.args", ["1e3", "0x10", "0o17", "1_000", "1.50", "-0", ".5", "12:30", "2024-01-01", ".inf", ".NaN"]),
    ("args-quoted", "  args: ['0123', \"on\", '']\n", [], "entrypoint.args", ["0123", "on", ""]),
    ("args-block-scalar", "  args:\n    - |\n      two\n      lines\n", [], "entrypoint.args", ["two\nlines\n"]),
    ("env-as-written", "env: {A: 0123, B: on, C: 1e3, D: 0x10, E: 1.0, F: true, G: 007}\n", [], "env",
     {"A": "0123", "B": "on", "C": "1e3", "D": "0x10", "E": "1.0", "F": "true", "G": "007"}),
    ("env-str-tag", "env: {A: !!str 0123}\n", [], "env", {"A": "0123"}),
    ("override-env-as-written", "", ["env.A=0123", "env.B=on", "env.C=1e3", "env.D=0x10"], "env",
     {"A": "0123", "B": "on", "C": "1e3", "D": "0x10"}),
    ("override-keeps-hash", "", ["env.A=a #b", "env.B=x#y", "env.C= #c"], "env", {"A": "a #b", "B": "x#y", "C": " #c"}),
    ("override-quoted", "", ["env.A='q #x'", 'env.B="tab\\there"', "env.C='it''s'"], "env",
     {"A": "q #x", "B": "tab\there", "C": "it's"}),
    ("override-unbalanced-quote", "", ["env.A='oops"], "env", {"A": "'oops"}),
    ("override-empty", "", ["env.A="], "env", {"A": ""}),
    ("override-yaml-lookalikes", "", ["env.A=*alias", "env.B=&anchor x", "env.C=!!int 3", "env.D=- x"], "env",
     {"A": "*alias", "B": "&anchor x", "C": "!!int 3", "D": "- x"}),
    ("override-args-list", "", ["entrypoint.args=[0123, on, '1e3']"], "entrypoint.args", ["0123", "on", "1e3"]),
    ("override-args-unparsable", "", ["entrypoint.args=[a, b"], None, "must be a list"),
    # typed fields: parsed by their type
    ("int", "resources: {nodes: 4}\n", [], "resources.nodes", 4),
    ("int-quoted", "resources: {nodes: '4'}\n", [], "resources.nodes", 4),
    ("int-hex-octal-underscore", "resources: {nodes: 0x10, cpus_per_task: 0o10}\nmodel: {layers: 1_000}\n", [],
     "resources.nodes,resources.cpus_per_task,model.layers", (16, 8, 1000)),
    ("int-override", "", ["resources.nodes=4"], "resources.nodes", 4),
    ("int-override-spaces", "", ["resources.nodes= 4 "], "resources.nodes", 4),
    ("float-from-int", "resources: {mem_gb: 100}\n", [], "resources.mem_gb", 100.0),
    ("float-exponent", "model: {params: 7.5e9}\n", [], "model.params", 7.5e9),
    ("float-quoted", "resources: {mem_gb: '1.5'}\n", [], "resources.mem_gb", 1.5),
    ("bool", "# site\npreemptible: True\n", [], "preemptible", True),
    ("optional-null", "resources: {gpus_per_node: null, partition: ~, cpus_per_task: }\n", [],
     "resources.gpus_per_node,resources.partition,resources.cpus_per_task", (None, None, None)),
    ("str-field-keeps-text", "resources: {time: 30}\n", [], "resources.time", "30"),
    ("time-as-written", "resources: {time: 1:30:00}\n", [], "resources.time", "1:30:00"),
    ("name-number", "# whole\nname: 123\nentrypoint: {script: train.py}\n", [], "name", "123"),
    # typed fields: refused, naming the key
    ("int-fraction", "resources: {nodes: 2.5}\n", [], None, "resources.nodes: must be a whole number, got 2.5"),
    ("int-float-spelling", "resources: {nodes: 2.0}\n", [], None, "resources.nodes: must be a whole number"),
    ("int-exponent", "resources: {nodes: 1e3}\n", [], None, "resources.nodes: must be a whole number, got 1e3 "
     "(written as a float; write 1000)"),
    ("int-huge-exponent", "resources: {nodes: 1e300}\n", [], None, "resources.nodes: must be a whole number, got 1e300"),
    ("int-bool", "resources: {nodes: true}\n", [], None, "resources.nodes: must be an integer, got true"),
    ("int-leading-zero", "resources: {nodes: 010}\n", [], None, "resources.nodes: 010 has a leading zero"),
    ("int-word", "resources: {nodes: two}\n", [], None, "resources.nodes: must be an integer, got 'two'"),
    ("int-null", "resources: {nodes: null}\n", [], None, "resources.nodes: must be an integer, got null"),
    ("int-huge", "resources: {nodes: 99999999999999999999}\n", [], None, "resources.nodes: 99999999999999999999 is "
     "out of range"),
    ("int-override-word", "", ["resources.nodes=many"], None, "command line: resources.nodes: must be an integer"),
    ("float-nan", "resources: {mem_gb: .nan}\n", [], None, "resources.mem_gb: must be a finite number"),
    ("float-inf", "model: {params: -.inf}\n", [], None, "model.params: must be a finite number"),
    ("float-nan-word", "resources: {mem_gb: NaN}\n", [], None, "resources.mem_gb: must be a finite number"),
    ("float-inf-quoted", "model: {params: 'inf'}\n", [], None, "model.params: must be a finite number"),
    ("float-overflow", "model: {params: 1e999}\n", [], None, "model.params: 1e999 is too large"),
    ("float-bool", "resources: {mem_gb: false}\n", [], None, "resources.mem_gb: must be a number, got false"),
    ("float-override-nan", "", ["model.params=nan"], None, "command line: model.params: must be a finite number"),
    ("bool-yes", "# site\npreemptible: yes\n", [], None, "must be true or false, got 'yes'"),
    ("bool-one", "# site\npreemptible: 1\n", [], None, "must be true or false, got '1'"),
    ("str-null", "env: {A: null}\n", [], None, "env.A: must be a string, got null"),
    ("str-mapping", "env: {A: {b: 1}}\n", [], None, "env.A: must be a string (a single value), got a mapping"),
    ("override-mapping-into-env", "", ["env.A={b: 1}"], None, "command line: env.A: must be a string"),
    ("override-list-into-env", "", ["env.A=[1, 2]"], None, "command line: env.A: must be a string"),
    ("override-mapping-into-int", "", ["resources.nodes={a: 1}"], None, "command line: resources.nodes: must be an"),
    ("override-scalar-into-section", "", ["resources=3"], None, "command line: resources: must be a mapping"),
    ("section-null", "resources:\n", [], None, "resources: must be a mapping of keys, got null"),
    ("list-null", "  args:\n", [], None, "entrypoint.args: must be a list, got null (write [] for none)"),
    ("override-lone-surrogate", "", ["env.A=a\udcffb"], None, "env.A: the value contains a lone surrogate"),
    ("override-lone-surrogate-in-list", "", ["entrypoint.args=[a\udcffb]"], None, "command line: entrypoint.args"),
    ("nul-in-string", "env: {A: \"a\\0b\"}\n", [], None, "env.A: the value contains a NUL character"),
    # Any fields (deepspeed:): YAML 1.2's typing of plain scalars; quoted ones are strings
    ("any-yaml12", "deepspeed: {a: 0x10, b: 1e3, c: on, d: '1', e: ~, f: [1, true, 2.5], g: 2024-01-01, h: 1_000}\n",
     [], "deepspeed", {"a": 16, "b": 1000.0, "c": "on", "d": "1", "e": None, "f": [1, True, 2.5], "g": "2024-01-01",
                       "h": "1_000"}),
    ("any-override", "", ["deepspeed.train_batch_size=8", "deepspeed.a.b=[1, '2']"], "deepspeed",
     {"train_batch_size": 8, "a": {"b": [1, "2"]}}),
    ("any-nan", "deepspeed: {a: {b: .nan}}\n", [], None, "deepspeed.a.b: must be a finite number"),
    ("any-leading-zero", "deepspeed: {a: 0123}\n", [], None, "deepspeed.a: 0123 has a leading zero"),
    # env values: $NAME, ${NAME} and $$ are the job shell's; dotted and resolver forms interpolate
    ("env-dollars", "env: {A: a$$b, B: $HOME, C: '${HOME}', D: '\\${HOME}', E: '${resources.nodes}', "
     "F: '$${resources.nodes}', G: 'x-${resources.time}-$USER', H: '\\\\${HOME}'}\n", [], "env",
     {"A": "a$$b", "B": "$HOME", "C": "${HOME}", "D": "${HOME}", "E": "1", "F": "$${resources.nodes}",
      "G": "x-01:00:00-$USER", "H": "\\${HOME}"}),
    ("env-oc-env", "env: {A: '${oc.env:GLAUNCH_TEST_VALUE}'}\n", [], "env", {"A": "v a l"}),
    ("env-override-interpolation", "resources: {nodes: 3}\n", ["env.N=${resources.nodes}", "env.H=${HOME}",
                                                               "env.E=\\${HOME}"], "env",
     {"N": "3", "H": "${HOME}", "E": "${HOME}"}),
    ("interpolation-typed", "resources: {nodes: '${oc.env:GLAUNCH_TEST_NODES}'}\n", [], "resources.nodes", 3),
    ("interpolation-path", "checkpoint: {dir: '${oc.env:HOME}/ck'}\n", [], "checkpoint.dir", "/home/alice/ck"),
    ("interpolation-args", "  args: ['--name', '${name}', '\\${name}']\n", [], "entrypoint.args",
     ["--name", "conv", "${name}"]),
    ("interpolation-any", "batch: {micro_size: 4}\ndeepspeed: {train_micro_batch_size_per_gpu: '${batch.micro_size}'}\n",
     [], "deepspeed", {"train_micro_batch_size_per_gpu": 4}),
    ("interpolation-unknown", "env: {A: '${nosuch.key}'}\n", [], None, "env.A: Interpolation key 'nosuch.key' not "
     "found"),
    ("interpolation-unclosed", "env: {A: '${resources.nodes'}\n", [], None, "env.A: unclosed '${'"),
    ("interpolation-loop", "env: {A: '${env.B}', B: '${env.A}'}\n", [], None, "env.A: the interpolation refers to itself"),
    ("interpolation-wrong-type", "resources: {nodes: '${name}'}\n", [], None,
     "resources.nodes: must be an integer, got 'conv'"),
    ("interpolation-list-into-str", "  args: [a]\nenv: {A: '${entrypoint.args}'}\n", [], None,
     "env.A: must be a string, but the interpolation gives a list"),
]


def _site_text(extra: str) -> str:
    return "name: conv\nscheduler: slurm\npartitions:\n  gpu:\n    gpus_per_node: 4\n" + \
        "".join("    " + line + "\n" for line in extra.splitlines())


def _value(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


@pytest.mark.parametrize("text,overrides,field,expected", [c[1:] for c in CONVERSIONS],
                         ids=[c[0] for c in CONVERSIONS])
def test_conversion(text, overrides, field, expected, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", "/home/alice")
    monkeypatch.setenv("GLAUNCH_TEST_VALUE", "v a l")
    monkeypatch.setenv("GLAUNCH_TEST_NODES", "3")
    path = tmp_path / "exp.yaml"
    if text.startswith("# site"):
        path.write_text(_site_text(text.split("\n", 1)[1]))
        loader = lambda: sites.load_site(str(path), tmp_path, ENVIRON).config.partitions["gpu"]  # noqa: E731
    else:
        path.write_text(text if text.startswith("# whole") else EXP + text)
        loader = lambda: load.load_experiment(path, overrides).config  # noqa: E731
    if field is None:
        with pytest.raises(ConfigError) as info:
            loader()
        assert expected in str(info.value)
        assert "Traceback" not in str(info.value)
        return
    obj = loader()
    got = tuple(_value(obj, f) for f in field.split(",")) if "," in field else _value(obj, field)
    assert got == expected
    assert repr(got) == repr(expected), "same value, other type"


def test_error_names_file_and_line(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP + "resources:\n  time: '01:00:00'\n  nodes: two\n")
    with pytest.raises(ConfigError) as info:
        load.load_experiment(path)
    assert (info.value.file, info.value.line, info.value.key) == (str(path), 6, "resources.nodes")


def test_list_item_error_names_its_line(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP + "  args:\n    - a\n    - {b: 1}\n")
    with pytest.raises(ConfigError) as info:
        load.load_experiment(path)
    assert (info.value.line, info.value.key) == (6, "entrypoint.args[1]")


def test_override_replacing_a_list_is_blamed_on_the_command_line(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP + "  args: [a, b, c]\n")
    with pytest.raises(ConfigError) as info:
        load.load_experiment(path, ["entrypoint.args=[x, {y: 1}]"])
    assert (info.value.file, info.value.key) == ("command line", "entrypoint.args[1]")


def test_extends_chain_with_provenance(tmp_path):
    (tmp_path / "base.yaml").write_text("name: base\nscheduler: slurm\nenv: {A: '1', B: x}\nmodules: [m1]\n"
                                        "partitions:\n  gpu: {gpus_per_node: 4, max_nodes: 2}\n")
    (tmp_path / "mid.yaml").write_text("name: mid\nextends: base.yaml\nenv: {B: y}\ndefault_partition: gpu\n"
                                       "partitions:\n  gpu: {max_nodes: 8}\n  cpu: {gpus_per_node: 0}\n")
    (tmp_path / "top.yaml").write_text("name: top\nextends: [mid.yaml]\nenv: {C: '3'}\nmodules: [m2]\n")
    loaded = sites.load_site("top.yaml", tmp_path, ENVIRON)
    cfg = loaded.config
    assert cfg.name == "top" and cfg.env == {"A": "1", "B": "y", "C": "3"}
    assert cfg.modules == ["m2"] and cfg.partitions["gpu"].max_nodes == 8 and cfg.partitions["gpu"].gpus_per_node == 4
    assert loaded.provenance.of("partitions.gpu.max_nodes", exact=True) == Origin(str(tmp_path / "mid.yaml"), 6)
    assert loaded.provenance.of("env.A", exact=True) == Origin(str(tmp_path / "base.yaml"), 3)
    assert loaded.provenance.of("modules[0]", exact=True) == Origin(str(tmp_path / "top.yaml"), 4)
    assert "modules[1]" not in loaded.provenance.origins   # base's list was replaced whole


def test_yaml_merge_keys(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("name: merged\nscheduler: slurm\npartitions:\n  a: &common {gpus_per_node: 4, max_time: '1:00:00'}\n"
                    "  b: {<<: *common, gpus_per_node: 8}\n")
    parts = sites.load_site(str(path), tmp_path, ENVIRON).config.partitions
    assert (parts["b"].gpus_per_node, parts["b"].max_time) == (8, "1:00:00")


# --- OmegaConf only for interpolation ------------------------------------------------------

_IMPORTS = ("import sys\nfrom launcher import cli\nsys.argv = ['glaunch', 'submit', sys.argv[1], "
            "'--dry-run', '--runs-dir', sys.argv[2], *sys.argv[3:]]\n"
            "try:\n    cli.main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('omegaconf' in sys.modules)\n")


def _imports_omegaconf(tmp_path, experiment: str, *extra: str) -> bool:
    env = dict(os.environ, GLAUNCH_STATE_DIR=str(tmp_path / "state"), **ENVIRON)
    proc = subprocess.run([sys.executable, "-c", _IMPORTS, experiment, str(tmp_path / "runs"), *extra], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1] == "True"


def test_plain_dry_run_does_not_import_omegaconf(tmp_path):
    assert not _imports_omegaconf(tmp_path, "examples/torch_ddp.yaml")
    assert not _imports_omegaconf(tmp_path, "examples/torch_ddp.yaml", "--site", "juwels-booster",
                                  "resources.nodes=2", "env.X=${HOME}", "env.Y=a$$b")


def test_interpolation_imports_omegaconf(tmp_path):
    assert _imports_omegaconf(tmp_path, "examples/torch_ddp.yaml", "env.N=${resources.nodes}")


@pytest.mark.parametrize("written, hint", [
    ("1e3", " (written as a float; write 1000)"), ("2.0", " (written as a float; write 2)"),
    ("-4.0e1", " (written as a float; write -40)"),
    # decided exactly: each one's float is whole, the number is not
    ("1.00000000000000001", ""), ("9007199254740990.5", ""), ("1e300", ""), ("2.5", ""),
])
def test_a_whole_number_written_as_a_float_is_told_how_to_write_it(written, hint, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP + f"resources: {{nodes: {written}}}\n")
    with pytest.raises(ConfigError) as info:
        load.load_experiment(path, [])
    assert str(info.value).endswith(f"resources.nodes: must be a whole number, got {written}{hint}")
