"""Which torch a site profile's environment gives the nodes (`glaunch sites check`).

The profile's environment step as env.sh runs it (modules, setup, env) and then the nodes'
interpreter command (the profile's `python:`, inside an apptainer image or a uenv where the
profile runs the job in one) are run once where Slurm's commands run: here, or on the
login node of a profile with `login:`. The interpreter prints Python's, torch's, CUDA's and
NCCL's versions. The login node stands in for the nodes (most clusters share their file
systems and module tree with it), so what it finds is reported, and a difference from the
submitting environment is a warning; where the step cannot run there (a pyxis image, no
`module` command, an image not on that host, no answer within the bound) the report says
"not checked" and why, and the check does not fail for it.

`environment_of`, `probe_script` and `read_answer` are pure; `probe` runs the script
through the Slurm client (one attempt, bounded).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Mapping, Sequence

from launcher import shell
from launcher.errors import GlaunchError
from launcher.resolution.jobplan import Container, JobPlan
from launcher.resolution.resolve import node_python
from launcher.schedulers.slurm.client import Client

# Importing torch from a shared file system on a busy login node can take tens of seconds.
TIMEOUT_S = 60.0
# Lines the probe prints, told apart from whatever the module system or setup prints.
ANSWER = "GLAUNCH-TORCH-PROBE "
NOT_HERE = "GLAUNCH-TORCH-NOT-HERE "
# The interpreter itself (no container, no uenv) is not there, or is about to be started:
# what follows, when no answer does, is its own failure to start.
NO_PYTHON = "GLAUNCH-TORCH-NO-PYTHON "
STARTING = "GLAUNCH-TORCH-STARTING"

# Run by the nodes' interpreter: any Python 3, torch or not; nothing but torch is imported.
PROBE_CODE = """\
import json, platform, sys
found = {"python": platform.python_version(), "executable": sys.executable}
try:
    import torch
except Exception as exc:
    found["error"] = type(exc).__name__ + ": " + str(exc)
else:
    found["torch"] = str(getattr(torch, "__version__", "unknown"))
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    if cuda:
        found["cuda"] = str(cuda)
        try:
            nccl = torch.cuda.nccl.version()
            found["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        except Exception:
            pass
print("%s%s" % (sys.argv[1], json.dumps(found)))
"""
# What `submit` runs: whether the interpreter starts and finds torch, without the seconds
# that importing it takes.
FIND_CODE = """\
import importlib.util, json, platform, sys
found = {"python": platform.python_version(), "executable": sys.executable}
try:
    spec = importlib.util.find_spec("torch")
except Exception as exc:
    spec, found["error"] = None, type(exc).__name__ + ": " + str(exc)
if spec is not None:
    found["torch"] = "found"
else:
    found.setdefault("error", "ModuleNotFoundError: No module named 'torch'")
print("%s%s" % (sys.argv[1], json.dumps(found)))
"""

NO_MODULES = "the profile loads modules, and this host has no module system (no `module` command)"
# The job inherits `module` from the submitting shell (sbatch exports its functions); a
# shell started over SSH has not run the profile scripts that define it.
MODULE_INIT = ('if ! command -v module >/dev/null 2>&1; then for f in /etc/profile.d/lmod.sh '
               '/etc/profile.d/modules.sh /usr/share/lmod/lmod/init/bash /usr/share/Modules/init/bash; do '
               'if [ -r "$f" ]; then . "$f" >/dev/null 2>&1 || true; break; fi; done; fi')


@dataclass(frozen=True)
class Environment:
    """What the probe runs: the profile's environment step, then `command` (the
    interpreter, wrapped in apptainer or uenv where the job runs in one). `image`: a file
    that must exist first (an apptainer image). `key`: the profile key that decides
    which torch the nodes import, for the warning."""

    command: tuple[str, ...]
    key: str
    modules: tuple[str, ...] = ()
    setup: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    image: str | None = None
    missing: str | None = None              # what to say when command[0] is not found


@dataclass(frozen=True)
class TorchProbe:
    """What the probe found (`versions`: python, executable, torch, cuda, nccl; `error`
    where the interpreter cannot import torch) or why it found nothing (`reason`)."""

    key: str
    where: str | None = None                # None: this machine; else the login node
    versions: Mapping[str, str] = field(default_factory=dict)
    reason: str | None = None
    # The nodes' interpreter does not start, or cannot import torch: no job of the profile
    # can run (`sites check` and `submit` fail, naming `key`).
    problem: str | None = None

    @property
    def checked(self) -> bool:
        return self.reason is None

    def line(self) -> str:
        """`torch: 2.5.1+cu124 (CUDA 12.4, NCCL 2.21.5, python 3.11.7) from /path/python`."""
        if self.reason is not None:
            return f"torch: not checked{f' (asked on {self.where})' if self.where else ''}: {self.reason}"
        found = self.versions
        at = f"{found.get('executable') or '?'}" + (f" on {self.where}" if self.where else "")
        if "torch" not in found:
            return (f"torch: none: python {found.get('python', '?')} at {at} cannot import it "
                    f"({found.get('error', 'no answer')})")
        built = [f"CUDA {found['cuda']}"] if found.get("cuda") else []
        built += [f"NCCL {found['nccl']}"] if found.get("nccl") else []
        return f"torch: {found['torch']} ({', '.join([*built, 'python ' + found.get('python', '?')])}) from {at}"

    def to_json(self) -> dict[str, Any]:
        return {"checked": self.checked, "where": self.where or "here", "key": self.key,
                "versions": dict(self.versions), "reason": self.reason, "problem": self.problem}


def environment_of(site: Any, submitting: str, home: str | None = None) -> Environment | str:
    """The probe's environment for a profile (config.schema.Site; `home`: what a leading ~
    in its `python:` stands for), or why the nodes' torch cannot be found out from a login
    node (a sentence)."""
    container = site.container
    if container is not None:
        unreachable = _unprobed(container.runtime, container.image)
        if unreachable:
            return unreachable
    try:
        command = node_python(site, Container(container.runtime, container.image, tuple(container.mounts))
                              if container is not None else None, submitting, home=home)
    except GlaunchError as exc:
        return f"no interpreter to run: {exc}"
    return _environment(site, _deciding_key(site), command)


def plan_environment(plan: JobPlan) -> Environment | str:
    """The probe's environment for the interpreter a job plan runs (resolution.JobPlan:
    its `launch.python` words, its profile's environment step), or why it cannot be probed."""
    site = plan.site
    container = site.get("container")
    if container:
        unreachable = _unprobed(str(container.get("runtime")), str(container.get("image")))
        if unreachable:
            return unreachable
    shaped = _SiteShape(container=SimpleNamespace(**container) if container else None, python=site.get("python"),
                        sbatch=site.get("sbatch") or {}, modules=site.get("modules") or (),
                        setup=site.get("setup") or (), env=site.get("env") or {})
    return _environment(shaped, _deciding_key(shaped), tuple(plan.launch.python))


@dataclass(frozen=True)
class _SiteShape:
    """The keys of a profile the probe reads, from a plan's copy of the profile."""

    container: Any
    python: Any
    sbatch: Mapping[str, Any]
    modules: Sequence[str]
    setup: Sequence[str]
    env: Mapping[str, Any]


def _unprobed(runtime: str, image: str) -> str | None:
    """Why a job in this container cannot be probed from a login node, or None."""
    if runtime != "apptainer":
        return f"the job runs in the {runtime} container {image}, which only srun starts, on the nodes"
    if "://" in image:
        return f"apptainer would first fetch {image}, which this check does not do"
    return None


def _environment(site: Any, key: str, command: Sequence[str]) -> Environment:
    """The environment step of profile `site` (modules, setup, env; a uenv around it) and `command`."""
    image = site.container.image if site.container is not None else None
    missing = None
    uenv = (site.sbatch or {}).get("uenv")
    if uenv:
        view = (site.sbatch or {}).get("view")
        command = ("uenv", "run", *([f"--view={view}"] if view else []), str(uenv), "--", *command)
        missing = f"the job runs in the uenv {uenv} (sbatch.uenv), and there is no uenv command on this host"
    elif image is not None:
        missing = f"the job runs in the apptainer image {image}, and there is no apptainer command on this host"
    return Environment(command=tuple(command), key=key, modules=tuple(site.modules), setup=tuple(site.setup),
                       env=tuple((str(k), str(v)) for k, v in (site.env or {}).items()), image=image,
                       missing=missing)


def _deciding_key(site: Any) -> str:
    if site.container is not None:
        return "container.image"
    if (site.sbatch or {}).get("uenv"):
        return "sbatch.uenv"
    if site.python:
        return "python"
    return "modules" if site.modules else "setup" if site.setup else "python"


def probe_script(env: Environment, code: str = PROBE_CODE) -> str:
    """The bash script the probe runs: as env.sh (`set -eo pipefail`, as job.sbatch sources
    it), each step that cannot run here giving up with a NOT_HERE line, then the command
    printing ANSWER and the versions. Every value is quoted by launcher.shell; the setup
    lines are the profile's own shell text, as in env.sh."""
    lines = ["set -eo pipefail"]
    if env.modules:
        lines += [MODULE_INIT,
                  f"command -v module >/dev/null 2>&1 || {_give_up(NO_MODULES)}"]
        lines += [f"module load {shell.quote(m)} || {_give_up(f'`module load {m}` failed')}" for m in env.modules]
    lines += list(env.setup)
    lines += [shell.export(name, value) for name, value in env.env]
    if env.image is not None:
        absent = _give_up(f"the container image {env.image} is not on this host")
        lines.append(f"[ -e {shell.quote(env.image)} ] || {absent}")
    program = env.command[0]
    missing = env.missing or (f"the interpreter {program} is not " +
                              ("an executable file" if "/" in program else "on PATH") + " on this host")
    marker = NOT_HERE if env.missing else NO_PYTHON
    lines.append(f"command -v {shell.quote(program)} >/dev/null 2>&1 || {_give_up(missing, marker)}")
    if not env.missing:
        lines.append(f"printf '%s\\n' {STARTING}")
    lines.append(f"exec {shell.join(env.command)} -c {shell.quote(code)} {shell.quote(ANSWER)}")
    # bash reads the script on stdin (a word with line breaks would reach the login node's
    # shell in bash's $'...', which not every login shell reads): one function, read whole
    # before it runs, with stdin closed, so no step can read the rest of the script.
    return "glaunch_torch_probe() {\n" + "\n".join(lines) + "\n}\nglaunch_torch_probe < /dev/null\n"


def _give_up(reason: str, marker: str = NOT_HERE) -> str:
    return f"{{ printf '%s\\n' {shell.quote(marker + reason)}; exit 3; }}"


def read_answer(returncode: int | None, stdout: str, stderr: str, *,
                timeout_s: float = TIMEOUT_S) -> tuple[dict[str, str], str | None]:
    """(versions, None) from the probe's output, or ({}, why it found nothing).
    `returncode` None: it ran past `timeout_s`."""
    if returncode is None:
        return {}, (f"the environment step and interpreter did not answer within {timeout_s:.0f} s "
                    "(a slow file system or module system; the nodes may still be fine)")
    for line in reversed(stdout.splitlines()):
        for marker in (NOT_HERE, NO_PYTHON):
            if line.startswith(marker):
                return {}, line[len(marker):].strip()
        if line.startswith(ANSWER) and returncode == 0:
            try:
                found = json.loads(line[len(ANSWER):])
            except ValueError:
                break
            if isinstance(found, dict):
                return {str(k): str(v) for k, v in found.items() if v is not None}, None
            break
    last = _last_line(stderr) or _last_line(stdout)
    if returncode != 0:
        return {}, f"the environment step ended with exit {returncode}" + (f": {last}" if last else "")
    return {}, "the interpreter printed no versions" + (f" ({last})" if last else "")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def interpreter_problem(env: Environment, stdout: str, versions: Mapping[str, str],
                        reason: str | None) -> str | None:
    """What the probe's output says is wrong with the nodes' interpreter itself (it is not
    there, it does not start, it cannot import torch), or None: a step before it that
    cannot run on this host, or no answer in time, says nothing of the nodes."""
    program = env.command[0]
    if any(line.startswith(NO_PYTHON) for line in stdout.splitlines()):
        return f"{reason}; the nodes run it"
    if versions and "torch" not in versions:
        return f"{versions.get('executable') or program} cannot import torch ({versions.get('error', '?')})"
    if not versions and reason and STARTING in stdout.splitlines() and "did not answer" not in reason:
        return f"the interpreter {program} did not start: {reason}"
    return None


def probe(client: Client, site: Any, submitting: str, *, where: str | None = None,
          timeout_s: float = TIMEOUT_S) -> TorchProbe:
    """Run the probe for profile `site` through `client` (here, or on the login node it
    reaches: `where` names it; a ~ in its `python:` is the home of the account there), one
    attempt within `timeout_s`."""
    key = _deciding_key(site)
    try:
        home = _home(client)
    except GlaunchError as exc:
        return TorchProbe(key, where, reason=f"the home directory there is not known: {exc}")
    return _run(client, environment_of(site, submitting, home), key, where, timeout_s, PROBE_CODE)


# The probe's one call: bash reading the probe script on its stdin.
PROBE_CALL = ("bash", "-s")


def probe_plan_call(plan: JobPlan) -> tuple[tuple[str, ...], str] | None:
    """(command, stdin) of probe_plan's one call, None where it makes none."""
    env = plan_environment(plan)
    if isinstance(env, str):
        return None
    try:
        return PROBE_CALL, probe_script(env, FIND_CODE)
    except shell.ShellTextError:
        return None


def probe_plan(client: Client, plan: JobPlan, *, where: str | None = None,
               timeout_s: float = TIMEOUT_S) -> TorchProbe:
    """Whether the interpreter a job plan runs starts and finds torch (without importing
    it), asked as `probe` asks."""
    env = plan_environment(plan)
    if isinstance(env, str):
        return TorchProbe("python", where, reason=env)
    return _run(client, env, env.key, where, timeout_s, FIND_CODE)


def _home(client: Client) -> str | None:
    """The home of the account `client` runs its commands as."""
    account = client.remote_account()
    return account.home if account is not None else os.environ.get("HOME")


def _run(client: Client, env: Environment | str, key: str, where: str | None, timeout_s: float,
         code: str) -> TorchProbe:
    if isinstance(env, str):
        return TorchProbe(key, where, reason=env)
    try:
        script = probe_script(env, code)
    except shell.ShellTextError as exc:
        return TorchProbe(key, where, reason=f"the environment step cannot be written as shell text: {exc}")
    try:
        outcome = client.attempt(list(PROBE_CALL), timeout_s, input=script)
    except GlaunchError as exc:
        return TorchProbe(key, where, reason=f"could not run bash: {exc}")
    proc = outcome.proc
    stdout = proc.stdout if proc is not None else ""
    versions, reason = read_answer(proc.returncode if proc is not None else None, stdout,
                                   proc.stderr if proc is not None else "", timeout_s=timeout_s)
    problem = interpreter_problem(env, stdout, versions, reason)
    return TorchProbe(key if not problem or env.missing else "python", where, versions, _on(reason, where),
                      _on(problem, where))


def _on(said: str | None, where: str | None) -> str | None:
    """What the probe said, its "this host" named (`where`, the login node it ran on)."""
    return said.replace(" on this host", f" on {where}") if said and where else said
