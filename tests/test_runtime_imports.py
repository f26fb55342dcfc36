"""The in-job runtime runs on every rank and on the batch host: importing it, the task
entry and the end-of-start step loads nothing of the submit-time stack."""

import subprocess
import sys

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
    "import launcher.jobcontrol.jobend",
    "import launcher.jobcontrol.controller",
    "import launcher.localrun.jobstep",
    "import launcher.rundir.layout",
])
def test_runtime_loads_no_submit_time_stack(statement):
    loaded = loaded_after(statement)
    assert not loaded & set(SUBMIT_TIME), sorted(loaded & set(SUBMIT_TIME))
    assert not loaded & set(TRAINING), sorted(loaded & set(TRAINING))


ADAPTERS = "import launcher.runtime, launcher.runtime.lightning, launcher.runtime.deepspeed, launcher.runtime.fsdp"


@pytest.mark.parametrize("statement", [ADAPTERS, "import launcher.runtime.task"])
def test_a_training_script_loads_no_controller(statement):
    """A rank imports the training library and its task: neither the job controller nor the
    local driver comes with them."""
    loaded = _full_names(statement)
    assert not {m for m in loaded if m.startswith(("launcher.jobcontrol", "launcher.localrun"))}


def test_the_controller_check_can_fail():
    assert "launcher.jobcontrol.watchdog" in _full_names("import launcher.localrun.jobstep")


def test_the_check_can_fail():
    assert "yaml" in loaded_after("import launcher.config.yamlfile")


def test_cli_loads_no_training_stack():
    loaded = loaded_after("import launcher.cli, launcher.api")
    assert not loaded & set(TRAINING), sorted(loaded & set(TRAINING))


def test_the_runtime_package_exports_its_functions():
    """`rt.context` is the rank-context function; every exported name is there."""
    code = ("from launcher import runtime as rt\n"
            "missing = [n for n in rt.__all__ if not hasattr(rt, n)]\n"
            "print(missing, callable(rt.context), rt.context().world_size)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["[]", "True", "1"]


def test_the_renderers_launch_words_load_no_rank_context():
    """The renderer imports launcher.rundir.launch on every submit: it loads neither the
    runtime nor socket."""
    loaded = _full_names("import launcher.rundir.launch")
    assert not any(m.startswith("launcher.runtime") for m in loaded) and "socket" not in loaded
