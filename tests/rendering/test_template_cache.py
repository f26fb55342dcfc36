"""Rendering is pure: turning a resolved plan into a run's files reads glaunch's own
templates and nothing else, and writes nothing, not while it renders and not when the
process ends, after its caller wrote the run directory (no cache of compiled templates,
no exit hook). Checked in a fresh process whose file accesses an audit hook reports,
installed once the plan is resolved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Events of a write to the file system (sys.audit's table); `open` counts when it may write.
PROBE = textwrap.dedent("""
    import atexit, json, os, sys
    from pathlib import Path

    WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    CHANGES = {"os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "os.unlink", "os.symlink",
               "os.link", "os.truncate", "os.chmod", "os.chown", "os.utime", "shutil.copyfile",
               "shutil.copytree", "shutil.move", "shutil.rmtree", "tempfile.mkstemp", "tempfile.mkdtemp"}
    # Python's own reads while rendering (modules imported on first use) are not the renderer's.
    CODE = (".py", ".pyc", ".so")
    seen = {"writes": [], "reads": []}
    watching = False

    def hook(event, args):
        if not watching:
            return
        if event == "open":
            path, mode, flags = args
            if (mode and any(c in mode for c in "wax+")) or (flags or 0) & WRITING:
                seen["writes"].append(f"open {path} {mode or flags}")
            elif isinstance(path, str) and not path.startswith(TEMPLATES) and not path.endswith(CODE):
                seen["reads"].append(path)
        elif event in CHANGES:
            seen["writes"].append(f"{event} {args[0]}")

    # Registered first, so it runs last: after any exit hook glaunch might register.
    atexit.register(lambda: print(json.dumps(seen)))

    from launcher import schedulers
    from launcher.config.load import load_experiment
    from launcher.config.sites import load_site
    from launcher.resolution.jobplan import SubmitContext
    from launcher.rendering.render import TEMPLATES
    from launcher.resolution.resolve import resolve

    TEMPLATES = str(TEMPLATES) + os.sep

    repo, site = Path(sys.argv[1]), sys.argv[2]
    exp = load_experiment(repo / "examples" / "torch_ddp.yaml")
    loaded = load_site(site, repo, os.environ)
    ctx = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=os.environ, run_id="pure-run")
    plan = resolve(exp, loaded, ctx)
    sys.addaudithook(hook)
    watching = True
    for _ in range(2):                 # the second render: from what the first one compiled
        files = schedulers.get(plan.scheduler).render(plan)
    assert files["job.sbatch"] and files["env.sh"], files
    watching = False                   # the caller writes the run directory, as a submit does
    run_dir = Path(plan.run_dir)
    (run_dir / "logs").mkdir(parents=True)
    for name, text in files.items():
        (run_dir / name).write_text(text)
    (run_dir / "run.json").write_text("{}")
    watching = True
""")


@pytest.mark.parametrize("site", ["local", "local-slurm"])
def test_rendering_writes_nothing(site, tmp_path):
    home, cwd, tmp = tmp_path / "home", tmp_path / "cwd", tmp_path / "tmp"
    for folder in (home, cwd, tmp):
        folder.mkdir()
    env = dict(os.environ, HOME=str(home), XDG_CACHE_HOME=str(home / ".cache"), TMPDIR=str(tmp),
               PYTHONPATH=str(REPO), PYTHONDONTWRITEBYTECODE="1", GLAUNCH_STATE_DIR=str(tmp_path / "state"))
    proc = subprocess.run([sys.executable, "-c", PROBE, str(REPO), site], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == {"writes": [], "reads": []}
    assert list(home.iterdir()) == list(tmp.iterdir()) == []
