"""Hostile values x every rendered context.

Each (value, context) is either refused with a ConfigError naming the key that gave it,
or rendered so that its reader (bash, sbatch's directive parser, pyxis/apptainer's mount
lists, the module command, DeepSpeed's JSON) reads back exactly the value, nothing runs
(the values try to create PWNED* marker files), the scripts pass plain `shellcheck`,
and no control or invisible character is written raw. Setup lines are raw shell by
design: only their control characters are checked.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import unicodedata
from functools import cache
from pathlib import Path

import pytest
from conftest import requires_slurm
from sbatch_parse import directive_arguments, read_directives

from launcher import schedulers
from launcher.config.load import load_experiment
from launcher.config.sites import load_site
from launcher.errors import ConfigError
from launcher import shell
from launcher.jobcontrol.controller import master_port
from launcher.resolution.jobplan import PORT_BASE, PORT_SPAN, PORT_STRIDE, SubmitContext
from launcher.resolution.resolve import resolve

# (class, value)
HOSTILE = [
    ("quote", "it's"), ("quote", 'a "b" c'), ("quote", "'"), ("quote", '"'), ("quote", "'\"'\""),
    ("command", "$(touch PWNED_cs)"), ("command", "x$(touch PWNED_cs2)y"), ("command", "`touch PWNED_bt`"),
    ("command", "; touch PWNED_sc"), ("command", "&& touch PWNED_and"), ("command", "| touch PWNED_pipe"),
    ("command", "> PWNED_redir"), ("command", "x[$(touch PWNED_arith)]"), ("command", "a[`touch PWNED_ab`]"),
    ("newline", "line1\nline2"), ("newline", "\n"), ("newline", "a\r\nb"), ("newline", "cr\rhidden"),
    ("control", "\x1b[31mred\x1b[0m"), ("control", "bell\x07"), ("control", "\x01\x02\x03"),
    ("control", "tab\there"), ("control", "\x0b\x0c"), ("control", "del\x7f"), ("control", "csi\x9b31m"),
    ("control", "\x85nel"), ("control", "\x1b]0;title\x07"),
    ("invisible", "\u202eevil"), ("invisible", "zero\u200bwidth"), ("invisible", "line\u2028sep"),
    ("invisible", "nb\u00a0sp"),
    ("space", "two  spaces"), ("space", " lead"), ("space", "trail "),
    ("glob", "*"), ("glob", "?"), ("glob", "[ab]"), ("glob", "{a,b}"),
    ("separator", "a,b"), ("separator", "a:b"), ("separator", "k=v"), ("separator", "a,b:c=d:ro"),
    ("backslash", "back\\slash"), ("backslash", "end\\"), ("backslash", "\\n"), ("backslash", "\\\\"),
    ("backslash", '\\"'),
    ("unicode", "ünïcødé ✓"), ("unicode", "日本語"), ("unicode", "emoji 🚀"),
    ("dash", "-n"), ("dash", "--help"), ("dash", "-"),
    ("dollar", "$HOME-x"), ("dollar", "$$HOME"), ("dollar", "$1"), ("dollar", "$"), ("dollar", "$GLAUNCH_UNSET_X"),
    ("dollar", "a$$b"),
    ("hash", "#hash"), ("hash", "a #b"),
    ("percent", "%j"), ("percent", "100%"),
    ("tilde", "~"), ("tilde", "~root"),
    ("other", "!bang"), ("other", ""), ("other", ".."), ("other", "a/b"), ("other", "x" * 3000),
    ("nul", "a\0b"),
]
VALUES = [v for _, v in HOSTILE]
CLASS_OF = {v: c for c, v in HOSTILE}

ENVIRON = {"HOME": "/home/alice", "USER": "alice"}
RUN_ID = "hostile-20260101-000000-abcd"
SITE = {"name": "hostile-site", "scheduler": "slurm", "default_partition": "gpu",
        "partitions": {"gpu": {"gpus_per_node": 2, "cpus_per_node": 8, "mem_gb": 64, "max_nodes": 4}}}
EXP = {"name": "hostile", "entrypoint": {"script": "train.py"}, "resources": {"nodes": 2, "time": "10"},
       "requeue": {"signal_lead_s": 30}}
# The environment the scripts are sourced with: a job on node1 with a plain job id.
BASH_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/h", "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node1"}
STUBS = "scontrol() { echo node1; }; module() { printf '%s\\0' \"$@\" >> \"$GLAUNCH_TEST_MODULES\"; }; "


def _yaml(doc) -> str:
    # JSON is YAML; \u escapes keep the file itself free of control characters.
    text = json.dumps(doc, ensure_ascii=False)
    return "".join(c if c.isprintable() or c == "\n" else f"\\U{ord(c):08x}" for c in text)


def _merge(base, extra):
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# --- contexts: (experiment extra, site extra, cwd, runs_dir) from a value ------------------

def _ctx(exp=None, site=None, cwd="/home/alice/exp", runs_dir=None):
    return _merge(EXP, exp or {}), _merge(SITE, site or {}), cwd, runs_dir


PYXIS = {"container": {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.09-py3", "mounts": ["/data"]}}
APPTAINER = {"container": {"runtime": "apptainer", "image": "/images/torch.sif", "mounts": ["/data"]}}
DEEPSPEED = {"strategy": {"name": "deepspeed", "zero_stage": 3, "offload_optimizer": "nvme"}}

CONTEXTS = {
    # name: (builder, the key a refusal must name)
    "env": (lambda v: _ctx(exp={"env": {"HOSTILE": v}}), "env.HOSTILE"),
    "site-env": (lambda v: _ctx(site={"env": {"HOSTILE": v}}), "env.HOSTILE"),
    "args": (lambda v: _ctx(exp={"entrypoint": {"args": ["--x", v]}}), "entrypoint.args"),
    "runs-dir": (lambda v: _ctx(runs_dir=f"/scratch/{v}/runs"), "--runs-dir"),
    "runs-root": (lambda v: _ctx(site={"runs_root": f"/scratch/{v}/runs"}), "runs_root"),
    "checkpoint-dir": (lambda v: _ctx(exp={"checkpoint": {"dir": f"/ck/{v}"}}), "checkpoint.dir"),
    # The working directory comes from the OS, always normalised.
    "workdir": (lambda v: _ctx(cwd=os.path.normpath(f"/home/{v}/exp")), "working directory"),
    # Without the code snapshot, which would run the copy in the run directory instead.
    "script": (lambda v: _ctx(exp={"entrypoint": {"script": f"/code/{v}/train.py"}, "code": {"snapshot": False}}),
               "entrypoint.script"),
    "name": (lambda v: _ctx(exp={"name": v}), "name"),
    "image-pyxis": (lambda v: _ctx(site=_merge(PYXIS, {"container": {"image": v}})), "container.image"),
    "image-apptainer": (lambda v: _ctx(site=_merge(APPTAINER, {"container": {"image": v}})), "container.image"),
    "mount-pyxis": (lambda v: _ctx(site=_merge(PYXIS, {"container": {"mounts": [f"/data/{v}"]}})),
                    "container.mounts"),
    "mount-apptainer": (lambda v: _ctx(site=_merge(APPTAINER, {"container": {"mounts": [f"/data/{v}"]}})),
                        "container.mounts"),
    "mounted-workdir": (lambda v: _ctx(site=PYXIS, cwd=os.path.normpath(f"/home/{v}/exp")), "working directory"),
    "mounted-checkpoint": (lambda v: _ctx(exp={"checkpoint": {"dir": f"/ck/{v}"}}, site=APPTAINER),
                           "checkpoint.dir"),
    "mounted-runs-dir": (lambda v: _ctx(site=PYXIS, runs_dir=f"/scratch/{v}/runs"), "--runs-dir"),
    "sbatch-extra": (lambda v: _ctx(site={"sbatch": {"comment": v}}), "sbatch.comment"),
    "account": (lambda v: _ctx(site={"account": v}), "account"),
    "qos": (lambda v: _ctx(site={"qos": v}), "qos"),
    "constraint": (lambda v: _ctx(site={"partitions": {"gpu": {"constraint": v}}}), "partitions.gpu.constraint"),
    "module": (lambda v: _ctx(site={"modules": [v]}), "modules"),
    "python": (lambda v: _ctx(site={"python": shlex.quote(v) + " -X utf8"}), "python"),
    "nvme-path": (lambda v: _ctx(exp=_merge(DEEPSPEED, {"strategy": {"nvme_path": v or "x"}})),
                  "strategy.nvme_path"),
    "setup": (lambda v: _ctx(site={"setup": [f"echo {v}"]}), "setup"),
    "env-job-id": (lambda v: _ctx(exp={"env": {"SLURM_JOB_ID": v}}), "env.SLURM_JOB_ID"),
}
DIRECTIVE_CONTEXTS = {"sbatch-extra", "account", "qos", "constraint", "runs-dir", "runs-root", "workdir"}
MOUNT_CONTEXTS = {"mount-pyxis", "mount-apptainer", "mounted-workdir", "mounted-checkpoint", "mounted-runs-dir"}


@cache
def render_case(context: str, value: str, root: str):
    """(plan, files) or the ConfigError; cached so the shellcheck pass reuses renders."""
    build, _ = CONTEXTS[context]
    exp_doc, site_doc, cwd, runs_dir = build(value)
    digest = hashlib.sha1(value.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    case_dir = Path(root) / f"{context}-{digest}"
    case_dir.mkdir(parents=True, exist_ok=True)
    (case_dir / "exp.yaml").write_text(_yaml(exp_doc))
    (case_dir / "site.yaml").write_text(_yaml(site_doc))
    try:
        exp = load_experiment(case_dir / "exp.yaml")
        site = load_site(str(case_dir / "site.yaml"), case_dir, ENVIRON)
        plan = resolve(exp, site, SubmitContext(cwd=cwd, python="/usr/bin/python3", environ=ENVIRON, run_id=RUN_ID,
                                                runs_dir=runs_dir))
        scheduler = schedulers.get(plan.scheduler)
        scheduler.check(plan)
        return plan, scheduler.render(plan)
    except ConfigError as exc:
        return exc


def _hidden(text: str, allowed: str = "\n") -> list[str]:
    return [f"U+{ord(c):04X}" for c in text if not c.isprintable() and c not in allowed]


def _words(text: str, cwd: Path) -> list[str]:
    """The words bash makes of `text` (which is run: a marker file shows execution)."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {text}"], cwd=cwd, capture_output=True,
                         env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]


def _source_env(files, names, cwd: Path, environ=None):
    """Source env.sh (with scontrol and module stubbed) and read back `names`."""
    path = cwd / "env.sh"
    path.write_text(files["env.sh"], encoding="utf-8")
    modules = cwd / "modules.out"
    modules.write_bytes(b"")
    printer = "; ".join(f'printf "%s\\0" "${{{n}-<unset>}}"' for n in names)
    env = dict(environ or BASH_ENV, GLAUNCH_TEST_MODULES=str(modules))
    out = subprocess.run(["bash", "-c", STUBS + f'source "$1" || exit 99; {printer}', "_", str(path)],
                         cwd=cwd, capture_output=True, env=env, timeout=30)
    values = out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    called = modules.read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]
    return out, dict(zip(names, values)), called


def _expand(value: str, environ) -> str:
    """What an env value means: $NAME and ${NAME} expand, $$ is a literal $."""
    return re.sub(r"\$\$|\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))",
                  lambda m: "$" if m.group(0) == "$$" else environ.get(m.group(1) or m.group(2), ""), value)


def _path(text: str) -> str:
    """A config path as glaunch means it: $NAME from the submitting environment, $$ a $."""
    return os.path.normpath(_expand(text, ENVIRON))


def _srun_words(files, cwd):
    # The job controller's line: its options, then `-- SRUN_WORDS -- TASK_WORDS`, the step's.
    text = files["job.sbatch"]
    words = _words(text[text.index("\nexec ") + len("\nexec "):].replace("\\\n", " "), cwd)
    step = words[words.index("--") + 1:]
    step.remove("--")
    return step


def _directives(files) -> dict[str, str]:
    args = read_directives(files["job.sbatch"])
    return dict(a[2:].split("=", 1) if "=" in a else (a[2:], True) for a in args)


# --- what each context must read back ----------------------------------------------------

def check_rendered(context, value, plan, files, cwd: Path):
    if context in ("env", "site-env"):
        out, seen, _ = _source_env(files, ["HOSTILE"], cwd)
        assert out.returncode == 0, out.stderr
        assert seen["HOSTILE"] == _expand(value, BASH_ENV)
    elif context == "args":
        line = next(x for x in files["job.sbatch"].splitlines() if x.startswith("#   python "))
        assert _words(line[len("#   python "):], cwd) == [plan.launch.entry_script, "--x", value]
        assert list(plan.launch.entry_args) == ["--x", value]
    elif context in ("runs-dir", "runs-root", "mounted-runs-dir"):
        assert plan.run_dir == _path(f"/scratch/{value}/runs/{RUN_ID}")
        out, seen, _ = _source_env(files, ["GLAUNCH_RUN_DIR", "GLAUNCH_CHECKPOINT_DIR"], cwd)
        assert out.returncode == 0, out.stderr
        assert seen == {"GLAUNCH_RUN_DIR": plan.run_dir, "GLAUNCH_CHECKPOINT_DIR": plan.run_dir + "/checkpoints"}
        assert _directives(files)["output"] == plan.run_dir + "/logs/%j_batch.log"
        source = next(x for x in files["job.sbatch"].splitlines() if x.startswith("source "))
        assert _words(source[len("source "):], cwd) == [plan.run_dir + "/env.sh"]
        assert f"--output={plan.run_dir}/logs/%j_%t_log.out" in _srun_words(files, cwd)
    elif context == "checkpoint-dir":
        out, seen, _ = _source_env(files, ["GLAUNCH_CHECKPOINT_DIR"], cwd)
        assert out.returncode == 0, out.stderr
        assert seen["GLAUNCH_CHECKPOINT_DIR"] == _path(f"/ck/{value}")
    elif context == "workdir":
        assert _directives(files)["chdir"] == os.path.normpath(f"/home/{value}/exp")
    elif context == "script":
        line = next(x for x in files["job.sbatch"].splitlines() if x.startswith("#   python "))
        assert _words(line[len("#   python "):], cwd) == [_path(f"/code/{value}/train.py")]
    elif context == "name":
        assert _directives(files)["job-name"] == value
    elif context == "image-pyxis":
        assert f"--container-image={value}" in _srun_words(files, cwd)
    elif context == "image-apptainer":
        words = _srun_words(files, cwd)
        assert words[words.index("exec") + 1:][:2] == ["--nv", "--bind"]
        assert value in words
    elif context in ("mount-pyxis", "mounted-workdir"):
        words = _srun_words(files, cwd)
        mounts = next(w for w in words if w.startswith("--container-mounts="))[len("--container-mounts="):]
        assert mounts.split(",") == list(plan.launch.container.mounts)
        assert all(len(m.split(":")) == 1 for m in plan.launch.container.mounts)
        expected = f"/data/{value}" if context == "mount-pyxis" else os.path.normpath(f"/home/{value}/exp")
        assert expected in plan.launch.container.mounts
    elif context in ("mount-apptainer", "mounted-checkpoint"):
        words = _srun_words(files, cwd)
        binds = [words[i + 1] for i, w in enumerate(words) if w == "--bind"]
        assert binds == list(plan.launch.container.mounts) and not any("," in b for b in binds)
        expected = f"/data/{value}" if context == "mount-apptainer" else _path(f"/ck/{value}")
        assert expected in binds
    elif context in ("sbatch-extra", "account", "qos", "constraint"):
        key = {"sbatch-extra": "comment"}.get(context, context)
        if value or context == "sbatch-extra":
            assert _directives(files)[key] == value
        else:
            assert key not in _directives(files)      # empty: not set
    elif context == "module":
        out, _, called = _source_env(files, [], cwd)
        assert out.returncode == 0, out.stderr
        assert called == ["load", value]
    elif context == "python":
        words = _srun_words(files, cwd)
        assert words[-7:] == [value, "-X", "utf8", "-u", "-m", "submitit.core._submit", plan.log_dir]
    elif context == "nvme-path":
        ds = json.loads(files["ds_config.json"])
        assert ds["zero_optimization"]["offload_optimizer"]["nvme_path"] == (value or "x")
    elif context == "setup":
        assert f"echo {value}" in files["env.sh"]
    elif context == "env-job-id":
        out, seen, _ = _source_env(files, ["MASTER_PORT"], cwd)
        if value.isascii() and value.isdigit() and len(value) <= 18:
            assert out.returncode == 0
            assert seen["MASTER_PORT"] == str(master_port(value, 0, (PORT_BASE, PORT_SPAN, PORT_STRIDE)))
        else:
            assert out.returncode == 99, "env.sh must stop on a job id that is not one"
            assert b"not a Slurm job id" in out.stderr


def must_refuse(context: str, value: str) -> bool:
    if "\0" in value:
        return True
    hidden = _hidden(value, "")
    if context in DIRECTIVE_CONTEXTS or context in MOUNT_CONTEXTS or context in ("checkpoint-dir", "script"):
        if hidden:
            return True
    if context in MOUNT_CONTEXTS and ("," in value or ":" in value):
        return True
    if context in ("runs-dir", "runs-root", "mounted-runs-dir") and ("%" in value or "\\" in value):
        return True
    if context in ("image-pyxis", "image-apptainer"):
        return bool(hidden) or not value or value.startswith("-") or any(c.isspace() or c == "," for c in value)
    if context == "module":
        return not value or value.startswith("-") or bool(set(value) - set(
            "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.+@%=~/:-"))
    if context == "setup":
        return bool(_hidden(value, "\n\t"))
    if context == "python":
        return not re.fullmatch(r"[A-Za-z0-9_./+@~-]*[A-Za-z0-9_]", value) or value.startswith("-")
    return False


def must_render(context: str, value: str) -> bool:
    """Values a context has no reason to refuse (env and args carry any text)."""
    if "\0" in value or must_refuse(context, value):
        return False
    if context in ("env", "site-env", "args"):
        return "${" not in value      # ${...} is OmegaConf interpolation, decided by the loader
    return context in ("sbatch-extra", "account", "qos", "constraint", "mount-apptainer", "mount-pyxis") \
        and not value.startswith("~")


CASES = [(context, cls, value) for context in CONTEXTS for cls, value in HOSTILE]


@pytest.fixture(scope="module")
def render_root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("hostile-render"))


@pytest.mark.parametrize("context,cls,value", CASES,
                         ids=[f"{c}-{cls}-{VALUES.index(v)}" for c, cls, v in CASES])
def test_hostile_value_in_context(context, cls, value, render_root, tmp_path):
    result = render_case(context, value, render_root)
    if isinstance(result, ConfigError):
        assert not must_render(context, value), f"refused: {result}"
        key = CONTEXTS[context][1]
        assert result.key and result.key.startswith(key), f"{result} names {result.key!r}, not {key!r}"
        assert not _hidden(str(result)), f"the message shows a raw control character: {str(result)!r}"
        return
    assert not must_refuse(context, value), f"rendered, should be refused: {value!r}"
    plan, files = result
    for name in ("job.sbatch", "env.sh"):
        allowed = "\n\t" if name == "env.sh" and context == "setup" else "\n"
        assert not _hidden(files[name], allowed), f"{name} holds raw control characters"
    for arg in read_directives(files["job.sbatch"]):
        assert arg.startswith("--")
    check_rendered(context, value, plan, files, tmp_path)
    assert not list(tmp_path.rglob("PWNED*")), "a value ran as a command"


def test_every_class_meets_every_context():
    counts = collections.Counter(cls for _, cls, _ in CASES)
    classes = {cls for cls, _ in HOSTILE}
    assert {c for _, c, _ in CASES} == classes and len(CONTEXTS) >= 20
    table = "\n".join(f"  {cls:12s} {n:4d}" for cls, n in sorted(counts.items()))
    print(f"\nhostile cases: {len(CASES)} = {len(HOSTILE)} values x {len(CONTEXTS)} contexts\n{table}")


@pytest.mark.skipif(not shutil.which("shellcheck"), reason="shellcheck not installed")
def test_every_rendered_case_passes_plain_shellcheck(render_root, tmp_path):
    """Plain `shellcheck`, no flags, over every distinct rendered script of the table."""
    seen: dict[str, str] = {}
    for context, _, value in CASES:
        if context == "setup":
            continue      # raw shell by design
        result = render_case(context, value, render_root)
        if isinstance(result, ConfigError):
            continue
        for name in ("job.sbatch", "env.sh"):
            seen.setdefault(result[1][name], f"{context}-{len(seen)}.{name}")
    paths = []
    for text, name in seen.items():
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    assert len(paths) > 100
    for start in range(0, len(paths), 200):
        check = subprocess.run(["shellcheck", *paths[start:start + 200]], capture_output=True, text=True,
                               timeout=600)
        assert check.returncode == 0, check.stdout[-5000:]


# --- arithmetic: whatever the job's environment holds -------------------------------------

JOB_IDS = [v for v in VALUES if "\0" not in v] + ["0", "007", "4294967295", "9" * 18, "9" * 19, "1e3", "0x10",
                                                 "-1", "1+1", "a[$(touch PWNED_ai)]", "x[0$(touch PWNED_x)]"]


@pytest.mark.parametrize("job_id", JOB_IDS, ids=range(len(JOB_IDS)))
def test_master_port_never_evaluates_the_job_id(job_id, render_root, tmp_path):
    plan, files = render_case("env", "plain", render_root)
    out, seen, _ = _source_env(files, ["MASTER_PORT"], tmp_path, dict(BASH_ENV, SLURM_JOB_ID=job_id))
    assert not list(tmp_path.rglob("PWNED*"))
    if job_id.isascii() and job_id.isdigit() and len(job_id) <= 18:
        assert out.returncode == 0, out.stderr
        assert seen["MASTER_PORT"] == str(master_port(job_id, 0, (PORT_BASE, PORT_SPAN, PORT_STRIDE)))
    else:
        assert out.returncode == 99
        assert b"not a Slurm job id" in out.stderr
        assert not _hidden(out.stderr.decode("utf-8", "replace")), "the message echoes control characters"


def test_env_sh_run_instead_of_sourced_still_evaluates_nothing(render_root, tmp_path):
    _, files = render_case("env", "plain", render_root)
    path = tmp_path / "env.sh"
    path.write_text(files["env.sh"])
    out = subprocess.run(["bash", "-c", STUBS + 'bash "$1"', "_", str(path)], cwd=tmp_path, capture_output=True,
                         env=dict(BASH_ENV, SLURM_JOB_ID="x[$(touch PWNED_run)]"), timeout=30)
    assert out.returncode != 0 and not list(tmp_path.rglob("PWNED*"))


# --- #SBATCH lines: the parse rules, and real sbatch when a cluster is up --------------------

SBATCH_VALUES = [v for v in VALUES if shell.sbatch_value_problem(v) is None]


@pytest.mark.parametrize("value", SBATCH_VALUES, ids=range(len(SBATCH_VALUES)))
def test_sbatch_directive_reads_back(value):
    assert directive_arguments(shell.sbatch_directive("comment", value)) == [f"--comment={value}"]


@pytest.mark.parametrize("value", [v for v in VALUES if shell.sbatch_value_problem(v) is not None])
def test_sbatch_directive_refuses_what_it_cannot_carry(value):
    with pytest.raises(shell.ShellTextError):
        shell.sbatch_directive("comment", value)


def test_sbatch_parse_rules_match_slurm():
    # Lines and what sbatch 22.05 reported for them (`sbatch -vvvvv --test-only`).
    assert directive_arguments('#SBATCH --job-name="a b\\\\c\\"d\'e"') == ["--job-name=a b\\c\"d'e"]
    assert directive_arguments("#SBATCH --comment='x\"y'") == ['--comment=x"y']
    assert directive_arguments("#SBATCH --job-name=a#b") == ["--job-name=a"]
    assert directive_arguments('#SBATCH --output="/tmp/a b/%j.log" # trailing') == ["--output=/tmp/a b/%j.log"]


@requires_slurm
def test_real_sbatch_reads_directives_back(tmp_path):
    """sbatch --test-only (queues nothing) reads each value back exactly."""
    for i, value in enumerate(SBATCH_VALUES):
        script = tmp_path / f"t{i}.sh"
        script.write_text(f"#!/bin/bash\n{shell.sbatch_directive('comment', value)}\ntrue\n", encoding="utf-8")
        out = subprocess.run(["sbatch", "-vvvvv", "--test-only", str(script)], capture_output=True, timeout=60)
        err = out.stderr.decode("utf-8", "surrogateescape")
        found = [line.split('argument "', 1)[1][:-1] for line in err.splitlines() if "Found in script" in line]
        assert found == [f"--comment={value}"], (value, err[-2000:])


# --- shell helpers: quote and expandable over the whole table -------------------------------

@pytest.mark.parametrize("value", [v for v in VALUES if "\0" not in v], ids=range(len(VALUES) - 1))
def test_quote_and_expandable_round_trip_through_bash(value, tmp_path):
    quoted, expanded = shell.quote(value), shell.expandable(value)
    assert not _hidden(quoted, "") and not _hidden(expanded, "")
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {quoted} {expanded}"], cwd=tmp_path,
                         capture_output=True, env={"PATH": "/usr/bin:/bin", "HOME": "/h"}, timeout=30)
    assert out.returncode == 0, out.stderr
    words = out.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    assert words == [value, _expand(value, {"HOME": "/h", "PATH": "/usr/bin:/bin"})]
    assert not list(tmp_path.glob("PWNED*"))


def test_nul_cannot_be_shell_text():
    for helper in (shell.quote, shell.expandable, shell.ansi_c_quote):
        with pytest.raises(shell.ShellTextError):
            helper("a\0b")


def test_every_non_printable_character_is_escaped():
    # All of C0, DEL, C1, and a sample of format/separator characters.
    chars = [chr(c) for c in [*range(1, 32), 127, *range(0x80, 0xA0), 0xA0, 0xAD, 0x200B, 0x200E, 0x202E, 0x2028,
                              0x2066, 0xFEFF]]
    assert all(unicodedata.category(c)[0] in "CZ" for c in chars)
    for ch in chars:
        for text in (shell.quote(f"a{ch}b"), shell.expandable(f"a{ch}b")):
            assert not _hidden(text, ""), (hex(ord(ch)), text)


# --- the dry run's terminal output -----------------------------------------------------------

TERMINAL_VALUES = [v for v in VALUES if "\0" not in v and "${" not in v]


def test_dry_run_prints_no_control_characters(tmp_path, isolated_env, monkeypatch, capsys):
    from launcher import cli

    (tmp_path / "train.py").write_text("")
    (tmp_path / "site.yaml").write_text(_yaml(_merge(SITE, {"sbatch": {"comment": "x"}})))
    shown = 0
    for i, value in enumerate(TERMINAL_VALUES):
        exp = _merge(EXP, {"name": f"t{i}", "entrypoint": {"args": [value]}, "env": {"HOSTILE": value}})
        (tmp_path / "exp.yaml").write_text(_yaml(exp))
        # The value in the runs folder's name too; where that name is refused (exit 2, said
        # plainly), the run again under a plain folder, so that every value's run is shown.
        for runs in (Path(f"{tmp_path}/runs-{value}"), tmp_path / "runs"):
            monkeypatch.setattr(sys, "argv", ["glaunch", "submit", str(tmp_path / "exp.yaml"), "--site",
                                              str(tmp_path / "site.yaml"), "--dry-run", "--runs-dir", str(runs)])
            monkeypatch.chdir(tmp_path)
            try:
                cli.main()
                code = 0
            except SystemExit as exc:
                code = exc.code
            out, err = capsys.readouterr()
            assert code in (0, 2), err
            assert not _hidden(out) and not _hidden(err), (value, out[-500:], err[-500:])
            if code == 0:
                shown += 1
                break
    assert shown == len(TERMINAL_VALUES)
    assert not list(tmp_path.rglob("PWNED*"))


# --- a real job on the local site: args and env values arrive literally ---------------------

REAL = ["it's", 'a "b" c', "$(touch PWNED1)", "`touch PWNED2`", "line1\nline2", "two  spaces", "ünïcødé ✓",
        "; touch PWNED3", "*", "back\\slash", "-n", "tab\there", "$HOME-x", "!bang", "\x1b[31mred", "csi\x9b",
        "del\x7f", "a,b:c"]


def _write_exp(directory: Path, args, env):
    script = directory / "seen.py"
    script.write_text(
        "import json, os, sys\n"
        "if os.environ['RANK'] == '0':\n"
        "    json.dump({'argv': sys.argv[1:], 'env': {k: os.environ[k] for k in %r}},\n"
        "              open(os.path.join(os.environ['GLAUNCH_RUN_DIR'], 'seen.json'), 'w'))\n" % sorted(env))
    exp = directory / "exp.yaml"
    exp.write_text(_yaml({"name": "hostile", "entrypoint": {"script": "seen.py", "args": args},
                          "resources": {"time": "5"}, "requeue": {"signal_lead_s": 10}, "env": env}))
    return exp


def test_hostile_name_is_rejected(tmp_path, isolated_env):
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: \"x$(touch PWNED)\"\nentrypoint: {script: seen.py}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(exp), "--dry-run",
                           "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=isolated_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "name" in proc.stderr
    assert not (tmp_path / "runs").exists() and not list(tmp_path.rglob("PWNED*"))


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])     # torchrun execs its workers with the arguments
def test_real_local_job_sees_hostile_args_and_env_literally(launcher, tmp_path, isolated_env):
    env_values = {"HOSTILE_A": "$(touch PWNED6) `touch PWNED7` it's \"q\"", "HOSTILE_B": "new\nline ünï",
                  "HOSTILE_C": "\x1b[31m\x9b\x7f", "HOSTILE_D": "$$HOME"}
    exp = _write_exp(tmp_path, REAL, env_values)
    runs = tmp_path / "runs with space"
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(exp), "--runs-dir", str(runs),
                           f"launcher={launcher}"], cwd=tmp_path, env=isolated_env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = runs.iterdir()
    seen = json.loads((run_dir / "seen.json").read_text())
    assert seen["argv"] == REAL
    assert seen["env"] == dict(env_values, HOSTILE_D="$HOME")
    assert not list(tmp_path.rglob("PWNED*"))
