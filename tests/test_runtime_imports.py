"""The in-job runtime runs on every rank and on the batch host: importing it, the task
entry and the end-of-start step loads nothing of the submit-time stack."""

import subprocess
import sys
from pathlib import Path

import pytest

SUBMIT_TIME = ("yaml", "omegaconf", "jinja2", "click")
# The dry-run path must not reach for the training stack either.
TRAINING = ("torch", "lightning", "pytorch_lightning", "deepspeed")


def loaded_after(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def _full_names(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


@pytest.mark.parametrize("statement", [
    "from launcher import runtime",
    "import launcher.runtime.task",
    "import launcher.runtime.jobend",
    "import launcher.runtime.localrun",
    "import launcher.runs.layout",
])
def test_runtime_loads_no_submit_time_stack(statement):
    loaded = loaded_after(statement)
    assert not loaded & set(SUBMIT_TIME), sorted(loaded & set(SUBMIT_TIME))
    assert not loaded & set(TRAINING), sorted(loaded & set(TRAINING))


def test_the_check_can_fail():
    assert "yaml" in loaded_after("import launcher.config.yamlfile")


def test_cli_loads_no_training_stack():
    loaded = loaded_after("import launcher.cli, launcher.api")
    assert not loaded & set(TRAINING), sorted(loaded & set(TRAINING))


def test_every_exported_name_is_the_modules_object_after_the_submodules_load():
    """Names are imported when first used; a submodule imported first must not shadow a
    function of the same name (`context`)."""
    code = ("import importlib, pkgutil\nimport launcher.runtime as rt\n"
            "for m in pkgutil.iter_modules(rt.__path__):\n"
            "    if m.name not in ('lightning', 'deepspeed', 'fsdp', 'dcp'):\n"
            "        importlib.import_module('launcher.runtime.' + m.name)\n"
            "bad = [n for n in rt.__all__ if getattr(rt, n) is not getattr(importlib.import_module("
            "'launcher.runtime.' + rt._EXPORTS[n]), n)]\n"
            "print(bad)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_package_loads_its_context_only_when_used():
    """The renderer imports launcher.runtime.launch on every submit: that must not load the
    rank context (and socket with it); `rt.context` stays the function whichever comes first."""
    loaded = _full_names("import launcher.runtime.launch")
    assert "launcher.runtime.context" not in loaded and "socket" not in loaded
    code = ("import launcher.runtime.context\nfrom launcher import runtime as rt\n"
            "from launcher.runtime import context\nprint(rt.context is context, rt.context().world_size)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "1"]


MAX_MODULE_LINES = 400


def modules_over(root: Path, limit: int) -> dict[str, int]:
    """Each module under ``root`` longer than ``limit`` lines, with its length."""
    lengths = {str(p.relative_to(root.parent)): len(p.read_text(encoding="utf-8").splitlines())
               for p in sorted(root.rglob("*.py"))}
    return {name: n for name, n in lengths.items() if n > limit}


def test_the_length_check_can_fail():
    root = Path(__file__).resolve().parents[1] / "launcher"
    assert "launcher/runtime/checkpoint_commit.py" in modules_over(root, 100)


def test_no_module_exceeds_the_line_limit():
    """A module stays short enough to read whole; a longer one is split by responsibility."""
    over = modules_over(Path(__file__).resolve().parents[1] / "launcher", MAX_MODULE_LINES)
    assert not over, f"over {MAX_MODULE_LINES} lines: " + ", ".join(f"{k} ({v})" for k, v in over.items())
