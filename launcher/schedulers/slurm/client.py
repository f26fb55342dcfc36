"""Every call to Slurm's client commands (sbatch, squeue, sacct, scancel, scontrol,
sacctmgr): a timeout on each attempt, a bounded retry with backoff on the errors a busy or
restarting controller gives, and the whole bounded, so that with the controller down a
command ends within a minute naming the controller it could not reach.

The decisions are pure and tested with a fake clock on recorded error texts
(`is_transient`, `RetryPolicy`, `parse_controller`, `clean_env`); `call` runs them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

from launcher.errors import SchedulerError
from launcher.processes import run_bounded, without_tool_prefix

# What Slurm's clients print when the controller (or the link to it) failed, not the
# request: worth another try. Slurm 22.05 wording, matched loosely.
TRANSIENT = re.compile("|".join((
    r"socket timed out on send/recv",
    r"unable to contact slurm controller",
    r"zero bytes were transmitted or received",
    r"communication connection failure",
    r"connection refused",
    r"connection reset by peer",
    r"transport endpoint is not connected",
    r"slurm temporarily unable to accept job",
    r"resource temporarily unavailable",
    r"slurmctld (?:is )?(?:not responding|busy|shutting down)",
    r"slurm backup controller in standby mode",
    r"controller is not responding",
)), re.IGNORECASE)


def is_transient(text: str) -> bool:
    """Whether a client's error output says the controller failed, not the request."""
    return bool(TRANSIENT.search(text or ""))


@dataclass(frozen=True)
class RetryPolicy:
    """How long one call to a Slurm client may take, in all.

    Each attempt gets `attempt_timeout_s`, cut to what is left of `budget_s`; after a
    transient failure the next attempt waits its backoff and runs only if at least
    `min_attempt_s` of the budget would remain for it. A client that cannot reach the
    controller retries on its own for about MessageTimeout (20 s by default) before it
    fails, so two attempts fit in the 40 s budget and a user waits under a minute."""

    attempts: int = 3
    attempt_timeout_s: float = 25.0
    budget_s: float = 40.0
    backoff_s: tuple[float, ...] = (1.0, 3.0)
    min_attempt_s: float = 10.0

    def attempt_timeout(self, elapsed: float) -> float:
        return max(min(self.attempt_timeout_s, self.budget_s - elapsed), 0.0)

    def next_delay(self, attempts_done: int, elapsed: float) -> float | None:
        """Seconds to wait before the next attempt, or None: give up."""
        if attempts_done >= self.attempts:
            return None
        delay = self.backoff_s[min(attempts_done - 1, len(self.backoff_s) - 1)] if self.backoff_s else 0.0
        if self.budget_s - elapsed - delay < self.min_attempt_s:
            return None
        return delay


# Queries and submission: the whole bounded as the product promises (under 60 s).
DEFAULT_POLICY = RetryPolicy()
# slurmdbd's commands (sacct, sacctmgr): optional answers, so a shorter bound.
ACCOUNTING_POLICY = RetryPolicy(attempts=2, attempt_timeout_s=15.0, budget_s=20.0, min_attempt_s=5.0)


# --- the environment of every Slurm command ------------------------------------------------------

# Input variables of Slurm's commands: they would override the profile's request.
SUBMISSION_INPUTS = ("SBATCH_", "SALLOC_", "SRUN_")
# Input variables of the query commands: filters or formats glaunch does not expect.
QUERY_INPUTS = ("SQUEUE_", "SACCT_", "SINFO_", "SCANCEL_", "SCONTROL_", "SACCTMGR_")
# SLURM_* of the submitting shell (an allocation's, inside salloc/srun) never reach a job.
KEEP = frozenset({"SLURM_CONF"})


def clean_env(environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(environment for Slurm's commands, the input variables dropped that a user may have
    meant to apply: SBATCH_*, SALLOC_*, SRUN_*). Drops SLURM_* but SLURM_CONF, and the
    query commands' input variables; times are read in Slurm's standard format."""
    env: dict[str, str] = {}
    ignored: list[str] = []
    for key, value in environ.items():
        if key.startswith(SUBMISSION_INPUTS):
            ignored.append(key)
        elif (key.startswith("SLURM_") and key not in KEEP) or key.startswith(QUERY_INPUTS):
            continue
        else:
            env[key] = value
    env["SLURM_TIME_FORMAT"] = "standard"
    return env, sorted(ignored)


def ignored_inputs_warning(ignored: Sequence[str]) -> str | None:
    if not ignored:
        return None
    return (f"ignoring {', '.join(ignored)} from the environment: Slurm input variables would override "
            "the site profile and the experiment (set those values there instead)")


# --- the controller, named -----------------------------------------------------------------------

DEFAULT_CONF = "/etc/slurm/slurm.conf"


def conf_path(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("SLURM_CONF") or DEFAULT_CONF


def parse_controller(text: str) -> tuple[list[str], str]:
    """(controller hosts, port) from slurm.conf's text: SlurmctldHost= lines (or the older
    ControlMachine=/ControlAddr=/BackupController=), SlurmctldPort= (default 6817)."""
    hosts: list[str] = []
    legacy: dict[str, str] = {}
    port = "6817"
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        m = re.match(r"(\w+)\s*=\s*(\S+)", line)
        if not m:
            continue
        key, value = m.group(1).lower(), m.group(2)
        if key == "slurmctldhost":
            hosts.append(value.replace("(", " (", 1) if "(" in value else value)
        elif key in ("controlmachine", "controladdr", "backupcontroller"):
            legacy[key] = value
        elif key == "slurmctldport":
            port = value
    if not hosts and "controlmachine" in legacy:
        addr = legacy.get("controladdr")
        hosts.append(legacy["controlmachine"] + (f" ({addr})" if addr else ""))
        if "backupcontroller" in legacy:
            hosts.append(legacy["backupcontroller"])
    return hosts, port


def describe_controller(environ: Mapping[str, str] = os.environ) -> str:
    """The controller this machine's clients talk to, for a message: its host(s) and port
    from the client's slurm.conf (scontrol cannot say so while it is unreachable)."""
    path = conf_path(environ)
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        if environ.get("SLURM_CONF"):
            return f"the Slurm controller (SLURM_CONF names {path!r}, which cannot be read)"
        return f"the Slurm controller (no readable {path}: a configless client finds it through DNS)"
    hosts, port = parse_controller(text)
    if not hosts:
        return f"the Slurm controller ({path} names no SlurmctldHost)"
    return f"the Slurm controller, slurmctld on {' or '.join(hosts)} port {port} (SlurmctldHost in {path})"


# --- running them ------------------------------------------------------------------------------------


class Unreachable(SchedulerError):
    """A Slurm service did not answer within the bound."""


@dataclass(frozen=True)
class Outcome:
    """One attempt: the process when it ended, or None when it ran past its timeout."""

    proc: subprocess.CompletedProcess[str] | None
    elapsed_s: float

    @property
    def timed_out(self) -> bool:
        return self.proc is None

    @property
    def output(self) -> str:
        if self.proc is None:
            return ""
        return ((self.proc.stderr or "") + "\n" + (self.proc.stdout or "")).strip()

    @property
    def transient(self) -> bool:
        return self.proc is None or (self.proc.returncode != 0 and is_transient(self.output))


# runner(cmd, timeout=, input=, env=): subprocess.run's contract, text in and out,
# TimeoutExpired past the timeout; stdin is /dev/null when input is None.
Runner = Callable[..., subprocess.CompletedProcess[str]]


def run_client(cmd: Sequence[str], *, timeout: float, input: str | None = None,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The Runner that runs Slurm's clients: a timeout kills the client's whole process
    group, and bytes that are not UTF-8 (a node's Reason, a user's comment) are read as
    U+FFFD, never as an error."""
    done = run_bounded(cmd, timeout_s=timeout, input=input.encode() if input is not None else None, env=env)
    if done is None:
        raise subprocess.TimeoutExpired(list(cmd), timeout)
    return subprocess.CompletedProcess(list(cmd), done.returncode, done.out, done.err)


@dataclass(frozen=True)
class Account:
    """Who Slurm's commands run as where they run on another machine (a login node over
    SSH): the user, the home directory and the Unix groups (None: not known) there."""

    user: str
    home: str
    groups: frozenset[str] | None = None


@dataclass
class Client:
    """Runs Slurm's commands under a RetryPolicy. `runner`, `clock` and `sleep` are
    replaced by fakes in the tests of the policy. `account_of`: set where `runner` reaches
    another machine, whose Slurm commands are taken to be there (PATH here says nothing);
    it says who they run as there, asked only when a command needs it."""

    runner: Runner = run_client
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    environ: Mapping[str, str] | None = None
    # After the controller was found unreachable, calls fail at once for a while: one
    # glaunch command then ends within one bound, not one per call it makes.
    remember_down_s: float = 60.0
    account_of: Callable[[], Account] | None = None
    # The other machine, as a message names it (the login node); None: this machine.
    where: str | None = None
    _down: tuple[float, str] | None = None

    def remote_account(self) -> Account | None:
        """Who the commands run as on the other machine (None: they run here)."""
        return self.account_of() if self.account_of is not None else None

    def has_command(self, name: str) -> bool:
        """Whether Slurm's command `name` can be run: on PATH here, or the commands run on
        another machine (a missing one fails there, saying so)."""
        return self.account_of is not None or shutil.which(name) is not None

    def env(self) -> dict[str, str]:
        return clean_env(os.environ if self.environ is None else self.environ)[0]

    def attempt(self, cmd: Sequence[str], timeout: float, *, input: str | None = None,
                env: Mapping[str, str] | None = None) -> Outcome:
        start = self.clock()
        try:
            proc = self.runner(list(cmd), timeout=timeout, input=input,
                               env=dict(env) if env is not None else self.env())
        except subprocess.TimeoutExpired:
            return Outcome(None, self.clock() - start)
        except OSError as exc:
            raise SchedulerError(f"{cmd[0]}: {exc}") from None
        return Outcome(proc, self.clock() - start)

    def call(self, *cmd: str, policy: RetryPolicy | None = None, input: str | None = None,
             env: Mapping[str, str] | None = None, deadline: float | None = None,
             controller: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `cmd`, retrying transient failures within `policy` (and before `deadline`,
        a clock() value). Returns the process of the last attempt when it ended without a
        transient error (its return code may say Slurm refused). Raises Unreachable when
        every attempt failed transiently: naming the controller when `controller`."""
        self._raise_if_known_down(controller)
        policy = policy or DEFAULT_POLICY
        start = self.clock()
        budget = policy.budget_s if deadline is None else min(policy.budget_s, deadline - start)
        bounded = RetryPolicy(policy.attempts, policy.attempt_timeout_s, budget, policy.backoff_s,
                              policy.min_attempt_s)
        done = 0
        while True:
            timeout = bounded.attempt_timeout(self.clock() - start)
            outcome = self.attempt(cmd, timeout, input=input, env=env) if timeout > 0 else Outcome(None, 0.0)
            done += 1
            if not outcome.transient:
                return outcome.proc  # type: ignore[return-value]
            delay = bounded.next_delay(done, self.clock() - start)
            if delay is None:
                raise self._unreachable(cmd, outcome, done, self.clock() - start, controller)
            self.sleep(delay)

    def submit(self, cmd: Sequence[str], *, lookup: Callable[[float], str | None],
               env: Mapping[str, str] | None = None, policy: RetryPolicy | None = None) -> str:
        """Run sbatch `cmd` so that a job is never queued twice: after a transient failure
        or a timeout (the controller may have queued the job and lost the answer),
        `lookup(deadline)` says whether the job is there (its id, or None) before any
        retry. Returns sbatch's stdout, or "Submitted batch job ID" for a job found.
        Raises SchedulerError when sbatch refused the job, Unreachable when every attempt
        failed and the lookup showed no job; lookup's own errors propagate."""
        self._raise_if_known_down(True)
        policy = policy or DEFAULT_POLICY
        start = self.clock()
        deadline = start + policy.budget_s
        done = 0
        while True:
            outcome = self.attempt(cmd, policy.attempt_timeout(self.clock() - start), env=env)
            done += 1
            proc = outcome.proc
            if proc is not None and not outcome.transient:
                if proc.returncode != 0:
                    said = _error_lines("sbatch", proc.stderr or proc.stdout)
                    raise SchedulerError(f"sbatch refused the job: {said}")
                return proc.stdout
            found = lookup(deadline)
            if found:
                return f"Submitted batch job {found}"
            delay = policy.next_delay(done, self.clock() - start)
            if delay is None:
                raise self._unreachable(cmd, outcome, done, self.clock() - start, True)
            self.sleep(delay)

    def _unreachable(self, cmd: Sequence[str], outcome: Outcome, attempts: int, elapsed: float,
                     controller: bool) -> Unreachable:
        said = (f"{cmd[0]} did not answer within {outcome.elapsed_s:.0f} s" if outcome.timed_out
                else f"{cmd[0]} said: {without_tool_prefix(cmd[0], _last_line(outcome.output))}")
        if controller:
            what = describe_controller(os.environ if self.environ is None else self.environ)
            message = f"cannot reach {what}: {said} ({attempts} attempt(s) in {elapsed:.0f} s)"
            self._down = (self.clock() + self.remember_down_s, message)
        else:
            message = f"{cmd[0]} could not reach Slurm's accounting (slurmdbd): {said}"
        return Unreachable(message)

    def _raise_if_known_down(self, controller: bool) -> None:
        if controller and self._down is not None:
            until, message = self._down
            if self.clock() < until:
                raise Unreachable(message)
            self._down = None

    def forget_down(self) -> None:
        self._down = None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "(nothing)"


def _error_lines(tool: str, text: str) -> str:
    """A refusal's lines, each once and without `tool`'s own prefix: sbatch names the cause
    (`invalid partition specified: nosuch`, `QOSMaxSubmitJobPerUserLimit`) before its last,
    generic line."""
    lines = list(dict.fromkeys(without_tool_prefix(tool, line) for line in (text or "").splitlines()
                               if line.strip()))
    return "; ".join(lines[-4:]) if lines else "(nothing)"


# This machine's client: the Slurm backend's transport where Slurm's commands run here.
# glaunch's commands share what it learnt about the controller. A login node reached over
# SSH has a client of its own (launcher.schedulers.ssh.on_login.slurm_client), handed to
# the backend (SlurmScheduler(client)) and to every query by whoever holds the connection.
CLIENT = Client()
