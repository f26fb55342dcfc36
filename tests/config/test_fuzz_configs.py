"""Fuzzing experiment and site documents: random YAML and JSON mappings built from the real
key names, with random scalars, lists and mappings, hostile strings and KEY=VALUE
overrides. Loading either succeeds or raises ConfigError -- never another exception,
never past a time bound -- and nothing in a value ever runs: every document that loads
is dry-run (its run directory written) and its env.sh sourced by bash, and no marker
file may appear.

GLAUNCH_FUZZ_EXAMPLES sets the number of documents per test (default 100)."""

import dataclasses
import json
import os
import re
import signal
import subprocess
import tempfile
import typing
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from launcher import api
from launcher.config import schema
from launcher.errors import ConfigError

EXAMPLES = int(os.environ.get("GLAUNCH_FUZZ_EXAMPLES", "100"))
LIMIT_S = 120      # a hang guard: one document takes well under a second, but CI machines are loaded
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])
MARKER = "PWNED"


class Raw(str):
    """Written into the YAML text as it is: a plain scalar (or whatever it turns out to be)."""


PAYLOADS = [f"$(touch {MARKER}1)", f"`touch {MARKER}2`", f"x[$(touch {MARKER}3)]", f"; touch {MARKER}4",
            f"a'b\"c$(touch {MARKER}5)", f"$((1+$(touch {MARKER}6)))", f"${{x:-$(touch {MARKER}7)}}",
            f"\n$(touch {MARKER}8)\n", f"\x1b]0;$(touch {MARKER}9)\x07", f"*/$(touch {MARKER}10)"]
PLAIN_LOOKALIKES = ["0123", "on", "off", "yes", "no", "1e3", "0x10", "0o17", ".nan", ".inf", "-.inf", "NaN",
                    "~", "null", "", "2.5", "-1", "0", "01:61:00", "1:30", "2-00:00:00", "2024-01-01", "1_000",
                    "9223372036854775808", "1e999", "true", "True", "a #b", "-x", "..", ".hidden", "x,y:z",
                    "${resources.nodes}", "${oc.env:HOME}", "${oc.env:GLAUNCH_FUZZ_UNSET}", "\\${HOME}", "a$$b",
                    "$HOME", "${HOME}", "${env.A}", "${nosuch.key}", "${", "${a", "$${x}", "\\\\${name}",
                    "${oc.decode:'[1, 2]'}", "${name}", "*alias", "&anchor x", "!!str 5", "? x", "- a",
                    "[a, b", "{a: 1", "'quoted'", '"dq\\tx"', "|", ">"]
texts = st.one_of(st.sampled_from(PAYLOADS), st.sampled_from(PLAIN_LOOKALIKES), st.text(max_size=12),
                  st.sampled_from(["x", "gpu", "ddp", "srun", "fp32", "01:00:00", "30", "--lr"]))
raw_leaves = st.builds(Raw, st.sampled_from(PLAIN_LOOKALIKES + [p.replace("\n", " ") for p in PAYLOADS]))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.integers(-2, 66),
                    st.floats(allow_nan=True, allow_infinity=True), texts, raw_leaves)
anything = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.one_of(texts, st.sampled_from(["a", "b", "stage"])), inner, max_size=4),
                        max_leaves=10)
env_names = st.one_of(st.sampled_from(["A", "B", "PATH", "OMP_NUM_THREADS", "SLURM_JOB_ID", "GLAUNCH_RUN_DIR",
                                       "MASTER_PORT", "IFS", "1X", "A-B", "SRUN_X", "x"]), st.text(max_size=6))

# Keys whose value is shell by design (a site's setup lines and python command) get
# only harmless text: the fuzz looks for values that run although they should not.
SAFE_TEXT = st.sampled_from(["true", ": ok", "python3", "/usr/bin/python3 -u"])
SPECIAL: dict[str, Any] = {
    "Experiment.name": st.one_of(st.sampled_from(["fz", "fz.run-1", "-x", ".x", "a b"]), texts, raw_leaves),
    "Experiment.site": st.sampled_from([None, "fz", "local", "nosuch", "", "./fz.yaml", Raw("~")]),
    "Entrypoint.script": st.one_of(st.just("train.py"), st.just("train.py"), st.just("train.py"), texts),
    "Experiment.entrypoint": st.fixed_dictionaries({"script": st.just("train.py")},
                                                   optional={"args": st.lists(st.one_of(texts, raw_leaves))}),
    "Site.partitions": st.dictionaries(st.sampled_from(["local", "gpu", "-p", "a b"]),
                                       st.deferred(lambda: _document(schema.Partition)),
                                       min_size=1, max_size=2),
    "Site.scheduler": st.sampled_from(["local", "local", "slurm", Raw("pbs")]),
    "Entrypoint.module": st.one_of(st.none(), st.sampled_from(["pkg.mod", "a b"]), texts),
    "Checkpoint.dir": st.one_of(st.none(), st.sampled_from(["ck", "ck dir/$(touch PWNED11)", "ck/`x`"])),
    "Strategy.nvme_path": st.one_of(st.none(), st.sampled_from(["nvme", "nvme $(touch PWNED12)"])),
    "Site.name": st.one_of(st.just("fz"), st.just("fz"), texts),
    "Site.setup": st.one_of(st.lists(SAFE_TEXT, max_size=2), scalars.filter(lambda v: not isinstance(v, str))),
    "Site.python": st.one_of(st.none(), SAFE_TEXT, st.sampled_from(["python3 'x", "", Raw("3")])),
    "Site.runs_root": st.one_of(st.none(), st.sampled_from(["runs", "$GLAUNCH_FUZZ_UNSET/x", "~/r"])),
    "Container.mounts": st.lists(st.sampled_from(["/a", "/b:/c", "/x,y"]), max_size=2),
    "Site.extends": st.sampled_from([None, "local", "base-slurm", "fz", "nosuch", ["local"]]),
}


def _typed(hint: Any, key: str) -> Any:
    """A strategy for a value of `hint`: mostly well-typed, sometimes anything at all."""
    if typing.get_origin(hint) is typing.Union:
        inner = next(a for a in typing.get_args(hint) if a is not type(None))
        return st.one_of(st.none(), _typed(inner, key))
    if hint is Any:
        return anything
    if dataclasses.is_dataclass(hint):
        return _document(hint)
    origin = typing.get_origin(hint)
    if origin is dict:
        item = typing.get_args(hint)[1]
        keys = env_names if key.endswith(".env") else st.one_of(texts, st.sampled_from(["gpu", "cpu", "exclusive",
                                                                                         "nodes", "mail-type"]))
        return st.dictionaries(keys, _typed(item, key + ".*"), max_size=3)
    if origin is list:
        return st.lists(_typed(typing.get_args(hint)[0], key + "[]"), max_size=3)
    return {int: st.one_of(st.sampled_from([1, 2, 8, 0, -1, 2 ** 62]), st.integers(), raw_leaves),
            float: st.one_of(st.sampled_from([1.0, 80.0, 0.5, 1e-9, 0.0, 1e300]), st.floats(), raw_leaves),
            bool: st.one_of(st.booleans(), raw_leaves), str: st.one_of(texts, raw_leaves)}[hint]


_CLASS_OF = {"": "Experiment", "entrypoint": "Entrypoint", "resources": "Resources", "strategy": "Strategy",
             "batch": "Batch", "model": "Model", "checkpoint": "Checkpoint", "requeue": "Requeue",
             "watchdog": "Watchdog", "container": "Container", "plan": "PlanSettings"}
for _dotted, _allowed in {**schema.EXPERIMENT_CHOICES, **schema.SITE_CHOICES}.items():
    _section, _, _field = _dotted.rpartition(".")
    _owner = "Site" if _dotted in schema.SITE_CHOICES and not _section else _CLASS_OF[_section]
    SPECIAL.setdefault(f"{_owner}.{_field}", st.one_of(st.sampled_from(_allowed), st.sampled_from(_allowed), texts))
SPECIAL.update({
    "Resources.time": st.one_of(st.sampled_from(["00:20:00", "30", "1-00:00:00", "01:61:00", "2:00", Raw("1:30")]),
                                texts),
    "Resources.partition": st.one_of(st.none(), st.just("local"), texts),
    "Resources.nodes": st.one_of(st.just(1), st.integers(-1, 3), raw_leaves),
    "Resources.gpus_per_node": st.one_of(st.none(), st.integers(0, 2), raw_leaves),
    "Strategy.zero_stage": st.one_of(st.integers(0, 3), raw_leaves),
    "Requeue.signal_lead_s": st.one_of(st.integers(0, 100), raw_leaves),
    "Batch.global_size": st.one_of(st.none(), st.sampled_from([2, 4, 6, 7]), raw_leaves),
})

MOSTLY = st.sampled_from([True] * 9 + [False])

# Keys most documents keep well-formed, so that the rest of a document gets checked too.
ANCHORS = {"Experiment.name", "Experiment.entrypoint", "Entrypoint.script", "Site.name", "Site.partitions",
           "Partition.gpus_per_node"}


@st.composite
def _fields(draw, cls: type) -> dict:
    hints = typing.get_type_hints(cls)
    doc = {}
    for f in dataclasses.fields(cls):
        name = f"{cls.__name__}.{f.name}"
        special = SPECIAL.get(name)
        good = special if special is not None else _typed(hints[f.name], name)
        if name in ANCHORS and draw(MOSTLY):
            doc[f.name] = draw(good)
            continue
        # Hypothesis leans towards the first of the choices: the well-formed value.
        pick = draw(st.sampled_from(["good", "omit", "good", "omit", "anything"]))
        if pick != "omit":
            doc[f.name] = draw(good if pick == "good" else anything)
    if cls is schema.Site and draw(st.booleans()):
        doc["extends"] = draw(SPECIAL["Site.extends"])
    if not draw(MOSTLY):
        doc[draw(st.sampled_from(["colour", "nodes", "resources"]))] = draw(anything)
    return doc


@st.composite
def _near_valid(draw, cls: type) -> dict:
    """A valid document with hostile args and env values and a few keys from a wild one."""
    free_text = st.one_of(texts, raw_leaves)
    env = draw(st.dictionaries(st.sampled_from(["A", "B", "C_1", "LC_X"]), free_text, max_size=4))
    if cls is schema.Experiment:
        doc = {"name": "fz", "entrypoint": {"script": "train.py", "args": draw(st.lists(free_text, max_size=5))},
               "env": env}
    else:
        doc = {"name": "fz", "scheduler": "local", "partitions": {"local": {"gpus_per_node": 1, "max_nodes": 1}},
               "env": env, "modules": draw(st.lists(free_text, max_size=2))}
    wild = draw(_fields(cls))
    for key in draw(st.lists(st.sampled_from(sorted(wild)), max_size=2, unique=True)) if wild else []:
        doc[key] = wild[key]
    return doc


def _document(cls: type):
    return st.one_of(_near_valid(cls), _fields(cls))


def emit_block(value: Any, indent: int = 0) -> str:
    """YAML text for `value` in block style (plain scalars may hold `{`, `,` and `#` there);
    Raw leaves verbatim."""
    pad = "  " * indent
    if isinstance(value, dict) and value:
        text = "".join(f"{pad}{_scalar(k)}:{emit_block(v, indent + 1)}" for k, v in value.items())
        return text if indent == 0 else "\n" + text
    if isinstance(value, list) and value:
        return "\n" + "".join(f"{pad}-{emit_block(v, indent + 1)}" for v in value)
    return " " + emit_flow(value) + "\n"


def emit_flow(value: Any) -> str:
    """YAML text for `value` in flow style: {k: v, ...}, [a, ...]."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_scalar(k)}: {emit_flow(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(emit_flow(v) for v in value) + "]"
    return _scalar(value)


def _scalar(value: Any) -> str:
    if isinstance(value, Raw):
        return str(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"nan": ".nan", "inf": ".inf", "-inf": "-.inf"}.get(repr(value), repr(value))
    if isinstance(value, int):
        return str(value)
    return _double_quoted(str(value))


def _double_quoted(text: str) -> str:
    """A YAML double-quoted scalar; what YAML may not hold raw is escaped."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif 0x20 <= code <= 0x7E or 0xA0 <= code <= 0xD7FF or 0xE000 <= code <= 0xFFFD or code >= 0x10000:
            out.append(char)
        else:
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
    return '"' + "".join(out) + '"'


def _as_json(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_json(v) for v in value]
    if isinstance(value, Raw):
        return str(value)
    return value


@st.composite
def serialized(draw, docs) -> str:
    doc = draw(docs)
    form = draw(st.sampled_from(["block", "block", "block", "flow", "json", "mutated"]))
    if form == "flow":
        return emit_flow(doc)
    if form == "json":
        # JSON is YAML, once the characters YAML may not hold raw are escaped; NaN stays NaN.
        return re.sub(r"[\x7f-\x9f\ufffe\uffff]", lambda m: f"\\u{ord(m.group()):04x}",
                      json.dumps(_as_json(doc), ensure_ascii=False))
    text = emit_block(doc)
    if form == "mutated" and text:
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(0, len(text)))
            text = text[:pos] + draw(st.sampled_from(list(":{}[],&*!|>'\"#-?%@`\n\t \\$") + ["&a ", "*a", "<<: "])) \
                + text[pos:]
    return text


DOTTED = ["name", "site", "launcher", "precision", "entrypoint.script", "entrypoint.args", "resources.nodes",
          "resources.time", "resources.mem_gb", "resources.gpus_per_node", "resources.partition",
          "strategy.name", "strategy.zero_stage", "batch.global_size", "batch.micro_size", "model.params",
          "deepspeed.x", "deepspeed", "env.A", "env.SLURM_JOB_ID", "env", "requeue.max", "requeue.signal_lead_s",
          "checkpoint.every_steps", "resources", "nodes", "env.A.B"]
override_values = st.one_of(texts, st.sampled_from(["[a, b]", "{x: 1}", "[", "{", "[0123, on]", "3", "1e3",
                                                    "null", "{a: &a [1], b: *a}", "a\udcffb", "[\udcff]",
                                                    '"\\ud800"', "x #y", "'q' #z"]))
overrides = st.lists(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(DOTTED), override_values), max_size=3)


@contextmanager
def bounded(seconds: int = LIMIT_S):
    def expire(signum, frame):
        raise TimeoutError(f"a document took more than {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def workdir():
    old = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="glaunch-fuzz-") as tmp:
        root = Path(tmp)
        (root / "site_configs").mkdir()
        (root / "train.py").write_text("print('hi')\n")
        os.chdir(root)
        try:
            yield root
        finally:
            os.chdir(old)
            leaked = [str(p) for p in list(root.rglob(f"{MARKER}*")) + list(Path(old).glob(f"{MARKER}*"))]
            assert not leaked, f"a value was executed: {leaked}"


STATS = {"documents": 0, "loaded": 0, "refused": 0}


def attempt(root: Path, exp_text: str, site_text: str | None, site: str | None, extra: list[str]) -> None:
    """Load, resolve and render; for what passes, write the dry run and source its env.sh."""
    (root / "exp.yaml").write_text(exp_text, errors="surrogateescape")
    if site_text is not None:
        (root / "site_configs" / "fz.yaml").write_text(site_text, errors="surrogateescape")
    STATS["documents"] += 1
    try:
        with bounded():
            prepared = api.prepare(root / "exp.yaml", site=site, overrides=extra, runs_dir=str(root / "runs"))
            run = api.launch(prepared, dry_run=True)
    except ConfigError as exc:
        STATS["refused"] += 1
        assert exc.file, f"error names no file: {exc}"
        return
    STATS["loaded"] += 1
    env_sh = Path(run.run_dir) / "env.sh"
    proc = subprocess.run(["bash", "-c", 'module() { :; }; source "$1"', "_", str(env_sh)], cwd=root,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(root / "home")}, capture_output=True,
                          timeout=20)
    del proc   # whether it succeeds is not the point here; that nothing ran is (checked on leaving workdir)


VALID_EXP = "name: fz\nentrypoint: {script: train.py}\n"
VALID_SITE = "name: fz\nscheduler: local\npartitions:\n  local: {gpus_per_node: 1, max_nodes: 1}\n"


@FUZZ
@given(exp_text=serialized(_document(schema.Experiment)), extra=overrides, site=st.sampled_from([None, "local"]))
def test_fuzz_experiments(exp_text, extra, site, isolated_env):
    with workdir() as root:
        (root / "site_configs" / "fz.yaml").write_text(VALID_SITE)
        attempt(root, exp_text, None, site, extra)


@FUZZ
@given(site_text=serialized(_document(schema.Site)), extra=overrides)
def test_fuzz_sites(site_text, extra, isolated_env):
    with workdir() as root:
        attempt(root, VALID_EXP, site_text, "fz", extra)


def test_fuzz_figures():
    """Runs last in this file: the counts of the two fuzz tests above, for the record."""
    if STATS["documents"] == 0:
        pytest.skip("the fuzz tests did not run")
    print(f"\nfuzz: {STATS['documents']} documents, {STATS['loaded']} loaded and dry-run, "
          f"{STATS['refused']} refused with ConfigError")
    assert STATS["loaded"] > 0, "no document loaded: the generators produce only errors"
