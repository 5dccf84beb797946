"""Spec loading within limits (issues 37, 38): an alias bomb, a file that is no spec, random
YAML and random values for every spec field each end in under 2 s, accepted or refused with
one line per problem that names the file or field and shows no more than an excerpt.

The 2 s is the issues' promise, so it stays a time bound, but of CPU time (`cpu_s`): what a
blow-up of the loader costs is work, and CPU time counts only that, where the wall clock also
counts the time a loaded host's other jobs hold the cores (the fuzz's examples take about 1 ms
of CPU here, the CLI's whole refusal about 0.25 s, so the bound is far from them either way).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from infra import provider_options_model
from pipelines.spec import BenchSpec, SpecError, load_spec
from pipelines.spec.load import MAX_SPEC_BYTES, parse_set

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

# The issue's bomb: nine levels, each list nine aliases of the level below (9**9 strings).
BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi", strict=True)
)
# Six levels of eight aliases: under the alias count, 8**7 values once expanded.
WIDE_BOMB = "a: &a [x,x,x,x,x,x,x,x]\n" + "".join(
    f"{b}: &{b} [{', '.join([f'*{a}'] * 8)}]\n" for a, b in zip("abcde", "bcdef", strict=True)
)
SHADOW = (
    "root:$6$Zq8dTq1R$Q5yJrXv3mG7w0k1pLh2sN9dEo4cUf8aBi6tRw3xYz1:20593:0:99999:7:::\n"
    "daemon:*:20593:0:99999:7:::\n"
    "postgres:!:20593::::::\n"
    "mlflow:$y$j9T$abcdefgh$ijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTU:20593:0:99999:7:::\n"
)


def cpu_s() -> float:
    """CPU seconds spent so far by this thread and by the child processes waited for."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + children.ru_utime + children.ru_stime


def ddlbench(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", "from pipelines.cli import main; main()", *args],
                          capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=60)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    return lines[0]


@pytest.mark.parametrize("bomb", [BOMB, WIDE_BOMB], ids=["nine-levels", "under-the-alias-count"])
def test_the_alias_bomb_ends_in_under_2_s_with_one_line(tmp_path, bomb):
    path = tmp_path / "bad4.yaml"
    path.write_text(bomb)
    assert len(bomb) < 400
    started = cpu_s()
    line = one_line_error(ddlbench("run", str(path)))
    assert cpu_s() - started < 2 + 1.5  # the CLI's own start (its imports, about 0.2 s) is the rest
    assert str(path) in line and ("aliases" in line) and "x', 'x" not in line
    started = cpu_s()
    with pytest.raises(SpecError, match="alias"):
        load_spec(path)
    assert cpu_s() - started < 2


def test_the_alias_bomb_through_set_and_overrides_is_refused(tmp_path):
    flow = "{" + BOMB.strip().replace("\n", ", ") + "}"
    with pytest.raises(SpecError, match="--set workers: uses more than 64 aliases"):
        parse_set([f"workers={flow}"])
    line = one_line_error(ddlbench("run", str(SMOKE), "--set", f"train={flow}"))
    assert line == "Error: --set train: uses more than 64 aliases; a spec may not"
    expanded: Any = ["x"] * 9
    for _ in range(8):
        expanded = [expanded] * 9  # what yaml.safe_load makes of it: one list, shared
    started = cpu_s()
    with pytest.raises(SpecError, match=r"^overrides\.h: holds more than 20000 values; a spec may not$"):
        load_spec(SMOKE, {"h": expanded})
    assert cpu_s() - started < 2


@pytest.mark.parametrize("content", [SHADOW, "root:x:0:0:root:/root:/bin/bash\n", "SECRET=hunter2\nTOKEN=abc\n",
                                     "\x00\x01\xff binary", "- a\n- b\n"],
                         ids=["shadow", "passwd", "env", "binary", "list"])
def test_a_file_that_is_no_spec_is_named_not_echoed(tmp_path, content):
    path = tmp_path / "secret"
    path.write_bytes(content.encode("latin-1") if "\xff" in content else content.encode())
    line = one_line_error(ddlbench("run", str(path)))
    assert str(path) in line and ("not a ddlbench spec" in line or "not a text file" in line)
    for word in ("root", "hunter2", "postgres", "daemon", "20593", "$6$", "bash", "TOKEN"):
        assert word not in line.replace(str(path), ""), line


@pytest.mark.skipif(not os.access("/etc/shadow", os.R_OK), reason="/etc/shadow is not readable here")
def test_the_issues_etc_shadow_is_refused_in_one_line_without_its_content():
    line = one_line_error(ddlbench("run", "/etc/shadow"))
    assert line == ("Error: /etc/shadow: not a ddlbench spec: expected a YAML mapping of spec fields "
                    "(version, name, suite, hardware, provider, workloads, ...); it has none of them")


def test_a_spec_with_foreign_lines_names_no_line_and_excerpts_values(tmp_path):
    """A spec's own fields are named with an excerpt of their value; keys that are not field
    names (another file's lines) are not repeated."""
    path = tmp_path / "mixed.yaml"
    path.write_text(SMOKE.read_text() + SHADOW + f"hardware: '{'h' * 5000}'\n")
    with pytest.raises(SpecError) as err:
        load_spec(path)
    text = str(err.value)
    assert "root" not in text and "postgres" not in text and "$6$" not in text
    assert "mixed.yaml.(a key not shown): not a spec field" in text
    assert "mixed.yaml.hardware" in text and "h" * 61 not in text
    assert all(len(line) <= 240 for line in text.splitlines())


def test_a_grid_too_big_to_expand_is_refused_at_once():
    started = cpu_s()
    with pytest.raises(SpecError, match=r"workers x batch_sizes: 17985003 training configs, more than the 1024"):
        load_spec(SMOKE, {"workers": list(range(1, 2000)), "batch_sizes": list(range(1, 3000))})
    assert cpu_s() - started < 2


def test_size_limit_and_odd_files(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(SMOKE.read_text() + "# " + "x" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(SpecError, match=f"big.yaml: larger than the {MAX_SPEC_BYTES} bytes a spec may have"):
        load_spec(big)
    with pytest.raises(SpecError, match="not a regular file"):
        load_spec(tmp_path)
    with pytest.raises(SpecError, match="not a regular file"):
        load_spec("/dev/zero")
    deep = tmp_path / "deep.yaml"
    deep.write_text("workers: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(SpecError, match="deep.yaml: nests deeper than 32 levels"):
        load_spec(deep)
    loop = tmp_path / "loop.yaml"
    loop.write_text("workers: &w [1, *w]\n")
    with pytest.raises(SpecError, match="loop.yaml: holds an alias to itself"):
        load_spec(loop)


# -- the fuzz: random documents and random values for every spec field --------------------------

def _fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        out.append(prefix + name)
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            out += _fields(sub, f"{prefix}{name}.")
    return out


FIELDS = _fields(BenchSpec) + [
    f"provider.options.{name}" for name in provider_options_model("local").model_fields
] + ["train.lr", "train.momentum", "train.threads", "train.eval_every", "algorithms", "workloads"]

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=80),
    st.sampled_from(["1gbit", "0", "-1", "1e400", "nan", "ps", "ssgd", "lenet5", "digits", "2025-01-01",
                     "&a", "*a", "!!python/object:os.system", "~", "yes"]),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=6),
    st.dictionaries(st.one_of(st.text(max_size=12), st.sampled_from(["name", "comm", "model", "dataset", "options"])),
                    inner, max_size=5),
), max_leaves=30)


def _accepted_or_one_line_per_problem(load: Any, names: list[str]) -> None:
    started = cpu_s()
    try:
        load()
    except SpecError as err:
        lines = str(err).splitlines()
        assert 1 <= len(lines) <= 21 and all(0 < len(line) <= 240 for line in lines), str(err)[:3000]
        if names:
            assert any(n in str(err) for n in names), (names, str(err)[:500])
    assert cpu_s() - started < 2  # the promise, in CPU seconds: a loaded host does not move it


@FUZZ
@given(field=st.sampled_from(FIELDS), value=VALUES)
def test_random_values_for_every_spec_field_are_accepted_or_named(field, value):
    """Through the Airflow path (overrides); the field, its section or its last name is in the error."""
    parts = field.split(".")
    names = [field, parts[0], parts[-1], "steps/epochs", "provider.options", "spec.train", "spec.algorithms"]
    _accepted_or_one_line_per_problem(lambda: load_spec(SMOKE, {field: value}), names)


YAML_PIECES = st.sampled_from([
    "name: x\n", "workers: [2]\n", "workers: &w [1, 2]\n", "batch_sizes: *w\n", "steps: 5\n", "{", "}", "[", "]",
    ": ", "- ", "  ", "\n", "&a ", "*a ", "!!binary ", "!!python/name:os.system ", "? ", "'", '"', "#", "|\n", ">\n",
    "---\n", "...\n", "%YAML 1.1\n", "\t", "provider:\n  name: slurm\n  options: {partition: 'a\nb'}\n",
    "hardware: cpu\n", "workloads: [{model: lenet5, dataset: digits}]\n", "algorithms: [{name: ssgd}]\n",
    "train: {lr: .inf}\n", "repeats: 1e9\n", "workers: [99999999999]\n", "what_if: {workers: [1048576]}\n",
])


@FUZZ
@given(doc=st.lists(st.one_of(YAML_PIECES, st.text(max_size=20)), max_size=25).map("".join))
def test_random_yaml_documents_load_or_fail_in_one_line_each(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("fuzz") / "doc.yaml"
    path.write_bytes(doc.encode(errors="replace"))
    _accepted_or_one_line_per_problem(lambda: load_spec(path), ["doc.yaml"])


@FUZZ
@given(doc=st.lists(YAML_PIECES, min_size=1, max_size=25).map("".join))
def test_random_documents_on_top_of_a_valid_spec(tmp_path_factory, doc):
    base = yaml.safe_load(SMOKE.read_text())
    path = tmp_path_factory.mktemp("fuzz") / "spec.yaml"
    path.write_text(yaml.safe_dump(base) + doc)
    _accepted_or_one_line_per_problem(lambda: load_spec(path), [])
