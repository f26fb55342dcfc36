"""The runner asks a run's road how to reach it: only the roads (launcher.runner.road for a
run, launcher.runner.submission_road for a submission) and the SSH code behind them
(launcher.runner.remote, remote_sweep, cluster_undo) know SSH. No other runner module imports them or
launcher.schedulers.ssh, wherever the import stands, or asks whether a run lives over SSH
(`is_remote`); nor does anything above the runner (the views, the API, the CLI)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "launcher"
RUNNER = PACKAGE / "runner"
ABOVE_THE_RUNNER = [*sorted((PACKAGE / "views").glob("*.py")), PACKAGE / "api.py", *sorted(PACKAGE.glob("cli*.py"))]
KNOW_SSH = {"road.py", "submission_road.py", "remote.py", "remote_sweep.py", "cluster_undo.py"}
SSH_MODULES = ("launcher.runner.remote", "launcher.runner.remote_sweep", "launcher.runner.cluster_undo",
               "launcher.schedulers.ssh")


def _is_ssh(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in SSH_MODULES)


def ssh_knowledge(source: str) -> list[str]:
    """Each line of `source` that imports the SSH road or asks is_remote, as 'LINE: what'."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if _is_ssh(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found += [f"{node.lineno}: from {base} import {a.name}" for a in node.names
                      if _is_ssh(base) or _is_ssh(f"{base}.{a.name}") or a.name == "is_remote"]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name == "is_remote":
                found.append(f"{node.lineno}: is_remote(...)")
    return found


def test_no_runner_module_but_the_road_knows_ssh():
    found = {path.name: lines for path in sorted(RUNNER.glob("*.py")) if path.name not in KNOW_SSH
             if (lines := ssh_knowledge(path.read_text(encoding="utf-8")))}
    assert not found, found


def test_nothing_above_the_runner_knows_ssh():
    assert len(ABOVE_THE_RUNNER) > 5
    found = {path.name: lines for path in ABOVE_THE_RUNNER if (lines := ssh_knowledge(path.read_text(encoding="utf-8")))}
    assert not found, found


def test_the_check_sees_each_way_of_reaching_ssh():
    assert ssh_knowledge("from launcher.runner import remote\n") == ["1: from launcher.runner import remote"]
    assert ssh_knowledge("def f():\n    from launcher.runner import remote_sweep\n")
    assert ssh_knowledge("import launcher.schedulers.ssh.connection\n")
    assert ssh_knowledge("from launcher.schedulers.ssh import on_login\n")
    assert ssh_knowledge("if lookup.is_remote(d):\n    pass\n") == ["1: is_remote(...)"]
    assert not ssh_knowledge("from launcher.runner import road, remote_python\nroad.to(d).cancel(d)\n")
