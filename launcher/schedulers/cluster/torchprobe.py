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
from dataclasses import dataclass, field
from typing import Any, Mapping

from launcher import shell
from launcher.errors import GlaunchError
from launcher.resolution.jobplan import Container
from launcher.resolution.resolve import node_python
from launcher.schedulers.slurm import client as slurm_client

# Importing torch from a shared file system on a busy login node can take tens of seconds.
TIMEOUT_S = 60.0
# Lines the probe prints, told apart from whatever the module system or setup prints.
ANSWER = "GLAUNCH-TORCH-PROBE "
NOT_HERE = "GLAUNCH-TORCH-NOT-HERE "

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
                "versions": dict(self.versions), "reason": self.reason}


def environment_of(site: Any, submitting: str) -> Environment | str:
    """The probe's environment for a profile (config.schema.Site), or why the nodes' torch
    cannot be found out from a login node (a sentence)."""
    key = _deciding_key(site)
    container = site.container
    image = None
    if container is not None:
        if container.runtime != "apptainer":
            return (f"the job runs in the {container.runtime} container {container.image}, which only srun "
                    "starts, on the nodes")
        if "://" in container.image:
            return f"apptainer would first fetch {container.image}, which this check does not do"
        image = container.image
    try:
        command = node_python(site, Container(container.runtime, container.image, tuple(container.mounts))
                              if container is not None else None, submitting)
    except GlaunchError as exc:
        return f"no interpreter to run: {exc}"
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


def probe_script(env: Environment) -> str:
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
    lines.append(f"command -v {shell.quote(program)} >/dev/null 2>&1 || {_give_up(missing)}")
    lines.append(f"exec {shell.join(env.command)} -c {shell.quote(PROBE_CODE)} {shell.quote(ANSWER)}")
    # bash reads the script on stdin (a word with line breaks would reach the login node's
    # shell in bash's $'...', which not every login shell reads): one function, read whole
    # before it runs, with stdin closed, so no step can read the rest of the script.
    return "glaunch_torch_probe() {\n" + "\n".join(lines) + "\n}\nglaunch_torch_probe < /dev/null\n"


def _give_up(reason: str) -> str:
    return f"{{ printf '%s\\n' {shell.quote(NOT_HERE + reason)}; exit 3; }}"


def read_answer(returncode: int | None, stdout: str, stderr: str, *,
                timeout_s: float = TIMEOUT_S) -> tuple[dict[str, str], str | None]:
    """(versions, None) from the probe's output, or ({}, why it found nothing).
    `returncode` None: it ran past `timeout_s`."""
    if returncode is None:
        return {}, (f"the environment step and interpreter did not answer within {timeout_s:.0f} s "
                    "(a slow file system or module system; the nodes may still be fine)")
    for line in reversed(stdout.splitlines()):
        if line.startswith(NOT_HERE):
            return {}, line[len(NOT_HERE):].strip()
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


def probe(site: Any, submitting: str, *, where: str | None = None, timeout_s: float = TIMEOUT_S) -> TorchProbe:
    """Run the probe for profile `site` under the shared Slurm client (here, or on the login
    node it reaches: `where` names it), one attempt within `timeout_s`."""
    key = _deciding_key(site)
    env = environment_of(site, submitting)
    if isinstance(env, str):
        return TorchProbe(key, where, reason=env)
    try:
        script = probe_script(env)
    except shell.ShellTextError as exc:
        return TorchProbe(key, where, reason=f"the environment step cannot be written as shell text: {exc}")
    try:
        outcome = slurm_client.CLIENT.attempt(["bash", "-s"], timeout_s, input=script)
    except GlaunchError as exc:
        return TorchProbe(key, where, reason=f"could not run bash: {exc}")
    proc = outcome.proc
    versions, reason = read_answer(proc.returncode if proc is not None else None,
                                   proc.stdout if proc is not None else "", proc.stderr if proc is not None else "",
                                   timeout_s=timeout_s)
    return TorchProbe(key, where, versions, reason)
