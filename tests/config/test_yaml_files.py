"""Config files are safe to read: only regular files, at most 1 MiB, aliases bounded,
recursive aliases, duplicate keys, deep nesting and deep `extends` chains refused with a
ConfigError naming the file -- each within a couple of seconds, never a hang, a
RecursionError or memory exhaustion."""

import os
import signal
from contextlib import contextmanager
from pathlib import Path

import pytest

from launcher.config import load, sites
from launcher.config.yamlfile import MAX_FILE_BYTES
from launcher.errors import ConfigError

ENVIRON = {"HOME": "/home/alice"}
EXP = "name: safe\nentrypoint: {script: train.py}\n"
SITE = "name: mysite\nscheduler: slurm\npartitions:\n  gpu: {gpus_per_node: 4}\n"
# Only a hang (a blocked read, an exponential expansion) gets near this, however loaded the
# machine: the bounds that matter are on the work (bytes read, values expanded), tested below.
HANG_S = 120


@contextmanager
def bounded(seconds: float = HANG_S):
    """Fails the test instead of hanging it: SIGALRM interrupts a blocked read."""
    def expire(signum, frame):
        raise TimeoutError(f"took more than {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused(path, *fragments, overrides=()):
    with bounded(), pytest.raises(ConfigError) as info:
        load.load_experiment(path, list(overrides))
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return info.value


def refused_site(name, cwd, *fragments):
    with bounded(), pytest.raises(ConfigError) as info:
        sites.load_site(name, cwd, ENVIRON)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return info.value


# --- what may be read ------------------------------------------------------------------


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "exp.yaml"
    os.mkfifo(fifo)
    refused(fifo, str(fifo), "not a regular file")


def test_fifo_site_profile_is_refused_without_blocking(tmp_path):
    (tmp_path / "site_configs").mkdir()
    os.mkfifo(tmp_path / "site_configs" / "pipe.yaml")
    refused_site("pipe", tmp_path, "pipe.yaml", "not a regular file")
    refused_site(str(tmp_path / "site_configs" / "pipe.yaml"), tmp_path, "not a regular file")


def test_dev_zero_is_refused(tmp_path):
    refused("/dev/zero", "/dev/zero", "not a regular file")
    link = tmp_path / "exp.yaml"
    link.symlink_to("/dev/zero")
    refused(link, "not a regular file")


def test_directory_is_refused(tmp_path):
    refused(tmp_path, "is a directory")


def test_huge_file_is_refused_by_size(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP + "env:\n" + "".join(f"  V{i}: {'x' * 60}\n" for i in range(MAX_FILE_BYTES // 60)))
    assert path.stat().st_size > MAX_FILE_BYTES
    refused(path, "larger than 1 MiB")


def test_sparse_huge_file_is_not_read_whole(tmp_path, monkeypatch):
    path = tmp_path / "exp.yaml"
    with open(path, "wb") as f:
        f.truncate(8 << 30)              # 8 GiB of holes: reading it whole would exhaust memory
    read = []
    real_read = os.read
    monkeypatch.setattr(os, "read", lambda fd, n: read.append(n) or real_read(fd, n))
    refused(path, "larger than 1 MiB")
    assert sum(read) <= MAX_FILE_BYTES + 1, "no more than the cap (and one byte to tell) is read"


def test_file_just_under_the_cap_loads(tmp_path):
    path = tmp_path / "exp.yaml"
    filler = "# " + "c" * 98 + "\n"
    path.write_text(EXP + filler * ((MAX_FILE_BYTES - len(EXP) - 1000) // len(filler)))
    assert path.stat().st_size <= MAX_FILE_BYTES
    with bounded():
        assert load.load_experiment(path).config.name == "safe"


def test_binary_file_is_refused(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_bytes(b"name: \xff\xfe\n")
    refused(path, "not UTF-8")


# --- aliases -------------------------------------------------------------------------------

BILLION_LAUGHS = "\n".join(
    [f"l0: &l0 [{', '.join(['lol'] * 9)}]"]
    + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 10)]) + "\n"


def test_alias_bomb_fails_fast(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(BILLION_LAUGHS)
    assert len(BILLION_LAUGHS) < 800
    refused(path, "aliases expand to more than")


def test_alias_bomb_inside_a_free_form_section(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP + "deepspeed:\n" + "".join("  " + line + "\n" for line in BILLION_LAUGHS.splitlines()))
    refused(path, "aliases expand to more than")


def test_alias_bomb_in_an_override(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP)
    bomb = "{a: &a [x, x, x, x, x, x, x, x, x, x], b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a], " \
           "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b], d: [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]}"
    refused(path, "command line", "aliases expand", overrides=[f"deepspeed.x={bomb}"])


@pytest.mark.parametrize("text", ["a: &a [1, *a]\n", "a: &a {b: *a}\n", "a: &a {b: [c, {d: *a}]}\n"],
                         ids=["list", "mapping", "nested"])
def test_recursive_alias_is_an_error(text, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    refused(path, "recursive alias *a")


def test_undefined_alias_is_an_error(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP + "env: {A: *nothing}\n")
    refused(path, "alias *nothing")


def test_ordinary_aliases_still_work(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(EXP + "env: {A: &v shared, B: *v}\n")
    assert load.load_experiment(path).config.env == {"A": "shared", "B": "shared"}


# --- duplicate keys ------------------------------------------------------------------------


@pytest.mark.parametrize("text,key,lines", ids=["top", "nested", "deeper", "flow", "section"], argvalues=[
    ("name: a\nentrypoint: {script: train.py}\nname: b\n", "name", (1, 3)),
    (EXP + "resources:\n  nodes: 1\n  time: '5'\n  nodes: 2\n", "resources.nodes", (4, 6)),
    (EXP + "deepspeed:\n  zero_optimization:\n    stage: 2\n    stage: 3\n", "deepspeed.zero_optimization.stage",
     (5, 6)),
    (EXP + "env: {A: 1, A: 2}\n", "env.A", (3, 3)),
    (EXP + "entrypoint: {script: other.py}\n", "entrypoint", (2, 3)),
])
def test_duplicate_keys_name_both_lines(text, key, lines, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    error = refused(path, "duplicate key", f"lines {lines[0]} and {lines[1]}")
    assert (error.key, error.line) == (key, lines[1])


def test_duplicate_keys_in_a_site_profile(tmp_path):
    (tmp_path / "site_configs").mkdir()
    (tmp_path / "site_configs" / "base.yaml").write_text(
        "name: base\nscheduler: slurm\npartitions:\n  gpu:\n    gpus_per_node: 4\n    max_nodes: 2\n"
        "    max_nodes: 8\n")
    (tmp_path / "site_configs" / "mysite.yaml").write_text("name: mysite\nextends: base\n")
    error = refused_site("mysite", tmp_path, "base.yaml", "partitions.gpu.max_nodes", "lines 6 and 7")
    assert error.line == 7


# --- nesting ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["a: " + "[" * 100_000 + "]" * 100_000 + "\n",
                                  "a: " + "{a: " * 50_000 + "1" + "}" * 50_000 + "\n",
                                  "".join("  " * i + f"k{i}:\n" for i in range(400)) + "  " * 400 + "v\n"],
                         ids=["lists", "flow-mappings", "block-mappings"])
def test_deep_nesting_is_an_error(text, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    refused(path, "nested deeper than")


def test_deep_extends_chain_is_an_error(tmp_path):
    (tmp_path / "site_configs").mkdir()
    for i in range(2000):
        (tmp_path / "site_configs" / f"s{i}.yaml").write_text(f"name: s{i}\nextends: s{i + 1}\n")
    (tmp_path / "site_configs" / "s2000.yaml").write_text(SITE.replace("mysite", "s2000"))
    refused_site("s0", tmp_path, "extends chain is deeper than")


def test_moderate_extends_chain_loads(tmp_path):
    (tmp_path / "site_configs").mkdir()
    for i in range(10):
        (tmp_path / "site_configs" / f"s{i}.yaml").write_text(f"name: s{i}\nextends: s{i + 1}\nenv: {{V{i}: x}}\n")
    (tmp_path / "site_configs" / "s10.yaml").write_text(SITE.replace("mysite", "s10"))
    loaded = sites.load_site("s0", tmp_path, ENVIRON)
    assert loaded.config.name == "s0" and len(loaded.chain) == 11 and len(loaded.config.env) == 10


# --- other YAML features that have no place in a config -------------------------------


UNSUPPORTED = [
    (EXP + "env: {A: !!python/object/apply:os.system [touch PWNED]}\n", "!!python/object/apply:os.system"),
    (EXP + "env: {A: !!binary aGk=}\n", "!!binary"),
    (EXP + "env: !!set {A: null}\n", "!!set"),
    (EXP + "deepspeed: {a: !!float 1}\n", "!!float"),
    (EXP + "---\nname: second\n", "more than one YAML document"),
    (EXP + "env: {[A]: x}\n", "a key must be a single value"),
]


@pytest.mark.parametrize("text,fragment", UNSUPPORTED, ids=["python-tag", "binary", "set", "float-tag",
                                                             "two-documents", "complex-key"])
def test_unsupported_yaml_is_an_error(text, fragment, tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    refused(path, fragment)
    assert not list(Path.cwd().glob("PWNED*")) and not list(tmp_path.glob("PWNED*"))
