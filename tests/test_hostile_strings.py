"""Hostile strings in args, env values and paths reach the job literally and never execute."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.rendering import shell

HOSTILE = ["it's", 'a "b" c', "$(touch PWNED1)", "`touch PWNED2`", "line1\nline2", "two  spaces",
           "ünïcødé ✓", "; touch PWNED3", "*", "back\\slash", "-n", "tab\there", "$HOME-x", "!bang"]


@pytest.mark.parametrize("value", HOSTILE)
def test_quote_round_trips_through_bash(value, tmp_path):
    out = subprocess.run(["bash", "-c", f"printf %s {shell.quote(value)}"], cwd=tmp_path, capture_output=True)
    assert out.stdout.decode() == value
    assert not list(tmp_path.glob("PWNED*"))


def test_expandable_expands_variables_only(tmp_path):
    text = shell.expandable("$HOME/x $(touch PWNED) `touch PWNED` ${HOME} \"q\" 'q'")
    out = subprocess.run(["bash", "-c", f"printf %s {text}"], cwd=tmp_path, capture_output=True,
                         env={"HOME": "/h"})
    assert out.stdout.decode() == "/h/x $(touch PWNED) `touch PWNED` /h \"q\" 'q'"
    assert not list(tmp_path.glob("PWNED*"))


def _write_exp(directory: Path, args, env):
    script = directory / "seen.py"
    script.write_text(
        "import json, os, sys\n"
        "if os.environ['RANK'] == '0':\n"
        "    json.dump({'argv': sys.argv[1:], 'env': {k: os.environ[k] for k in %r}},\n"
        "              open(os.path.join(os.environ['GLAUNCH_RUN_DIR'], 'seen.json'), 'w'))\n" % sorted(env))
    exp = directory / "exp.yaml"
    exp.write_text(json.dumps({"name": "hostile", "entrypoint": {"script": "seen.py", "args": args},
                               "resources": {"time": "5"}, "requeue": {"signal_lead_s": 10}, "env": env}))
    return exp


def test_dry_run_scripts_keep_hostile_values_literal(tmp_path, isolated_env):
    env_values = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    exp = _write_exp(tmp_path, HOSTILE, env_values)
    runs = tmp_path / "runs dir 'q' \"d\" $(touch PWNED4)"
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(exp), "--dry-run", "--json",
                           "--runs-dir", str(runs), "checkpoint.dir=" + str(tmp_path / "ck `touch PWNED5`")],
                          cwd=tmp_path, env=isolated_env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    run_dir = Path(json.loads(proc.stdout)["run_dir"])
    names = sorted(env_values) + ["GLAUNCH_RUN_DIR", "GLAUNCH_CHECKPOINT_DIR"]
    printer = "; ".join(f'printf "%s\\0" "${n}"' for n in names)
    out = subprocess.run(["bash", "-c", f'source "$1"; {printer}', "_", str(run_dir / "env.sh")], cwd=tmp_path,
                         capture_output=True, env={"PATH": "/usr/bin:/bin", "HOME": "/h"})
    assert out.returncode == 0, out.stderr
    seen = dict(zip(names, out.stdout.decode().split("\0")))
    for name, value in env_values.items():
        expected = value.replace("$HOME", "/h")   # a $NAME reference expands at job time, by design
        assert seen[name] == expected, name
    assert seen["GLAUNCH_RUN_DIR"] == str(run_dir)
    assert seen["GLAUNCH_CHECKPOINT_DIR"] == str(tmp_path / "ck `touch PWNED5`")
    for name in ("job.sbatch", "env.sh"):
        assert subprocess.run(["bash", "-n", str(run_dir / name)]).returncode == 0
        if shutil.which("shellcheck"):
            check = subprocess.run(["shellcheck", "-s", "bash", str(run_dir / name)], capture_output=True, text=True)
            assert check.returncode == 0, check.stdout
    assert not list(tmp_path.rglob("PWNED*"))


def test_hostile_name_is_rejected(tmp_path, isolated_env):
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: \"x$(touch PWNED)\"\nentrypoint: {script: seen.py}\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(exp), "--dry-run",
                           "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=isolated_env,
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "name" in proc.stderr
    assert not (tmp_path / "runs").exists() and not list(tmp_path.rglob("PWNED*"))


def test_real_local_job_sees_hostile_args_and_env_literally(tmp_path, isolated_env):
    env_values = {"HOSTILE_A": "$(touch PWNED6) `touch PWNED7` it's \"q\"", "HOSTILE_B": "new\nline ünï"}
    exp = _write_exp(tmp_path, HOSTILE, env_values)
    runs = tmp_path / "runs with space"
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(exp), "--runs-dir", str(runs)],
                          cwd=tmp_path, env=isolated_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run_dir,) = runs.iterdir()
    seen = json.loads((run_dir / "seen.json").read_text())
    assert seen["argv"] == HOSTILE
    assert seen["env"] == env_values
    assert not list(tmp_path.rglob("PWNED*"))
