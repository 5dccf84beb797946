"""Suite-wide test plumbing: services CI starts, and what a test does when one does not answer.

A test that needs a service (PostgreSQL, the SLURM clusters, root for network namespaces) is
marked with `needs_service(name, check)`. Outside CI an absent service skips the test with its
reason, so a developer's machine runs what it can. Under CI (`CI` set to true, as .ci/run and
every hosted CI set it) the same test FAILS naming the service: CI starts every such service
(.ci/run runs scripts/services/*.sh), so one that does not answer is a broken CI, not a reason to
stay green.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import re
import socket
import tempfile
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import psutil
import pytest
from _pytest.mark.expression import Expression
from hypothesis import settings

# Hypothesis without its 200 ms deadline per example, in one place for the whole suite: the
# deadline is wall time, which a loaded host (the 2 cores CI shares with its services and
# training jobs) stretches past any fixed figure, so it failed correct code at random. A test
# whose point is a time bound states it itself (tests/test_security_spec.py, in CPU time).
settings.register_profile("ddlbench", deadline=None)
settings.load_profile("ddlbench")

ServiceCheck = Callable[[], str | None]


def free_port() -> int:
    """A TCP port the OS has free now, for a rendezvous a test starts itself: a fixed port clashes
    with a parallel run or a test of the same session still closing."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def in_ci() -> bool:
    """Whether this run is CI's (CI=true/1/yes, the variable hosted CI runners and .ci/run set)."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def require_service(name: str, why_not: str | None) -> None:
    """Return when `why_not` is None (the service answers); else skip, or fail under CI, naming it."""
    if why_not is None:
        return
    if in_ci():
        pytest.fail(f"CI=true and the {name} service does not answer: {why_not}", pytrace=False)
    pytest.skip(f"{name}: {why_not}")


@cache
def _ask(check: ServiceCheck) -> str | None:
    # A service is asked once per session: the answer does not change between tests, and an
    # `scontrol ping` per test would add seconds.
    return check()


def needs_service(name: str, check: ServiceCheck) -> pytest.MarkDecorator:
    """A mark: before the test, `check()` says why `name` is unusable (None: it answers), and
    the test skips or, under CI, fails (`require_service`). Checked at setup, not at import, so a
    module that merely imports the mark never touches the service."""
    return pytest.mark.needs_service.with_args(name, check)


def _root_why_not() -> str | None:
    return None if os.geteuid() == 0 else "not root (network namespaces, tc and mounts need it)"


# Root: CI runs as root (.ci/run), so there a test that needs it fails rather than skips.
needs_root = needs_service("root", _root_why_not)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "needs_service(name, check): needs a service CI starts; skips outside CI, fails under CI"
    )
    config.addinivalue_line(
        "markers", "alone: reads the timings of real jobs, or loads the host on purpose: no other test runs "
        "beside it (scripts/test.sh); slow too"
    )


def may_select(markexpr: str, marks: frozenset[str]) -> bool:
    """Whether a `-m` expression can select a test that carries every one of `marks`: true for
    some choice of the other marks it names. One it cannot read, or one naming many marks, counts
    as yes."""
    if not markexpr.strip():
        return True
    try:
        expression = Expression.compile(markexpr)
    except SyntaxError:
        return True
    others = sorted(set(re.findall(r"[A-Za-z_][\w.]*", markexpr)) - {"and", "or", "not"} - marks)
    if len(others) > 8:
        return True
    choices = (frozenset(c) | marks for k in range(len(others) + 1) for c in itertools.combinations(others, k))
    return any(expression.evaluate(lambda name, /, chosen=chosen, **_: name in chosen) for chosen in choices)


# A test marked `alone` is slow too (pytest_collection_modifyitems), so a selection holds one
# only if it can hold a test with both marks.
ALONE = frozenset({"alone", "slow"})


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (scripts/test.sh): a selection without a test marked `alone` spreads over the CPUs;
    one that may hold such a test stays in one process, because that test reads the timings of real
    jobs on this host (or loads it on purpose), and a second worker's load would be in its figures.
    Slow tests go to the workers a module at a time, so its fixtures (a deployment, a cluster, a
    history of runs) are built once; the others a test at a time."""
    markexpr = config.option.markexpr or ""
    if may_select(markexpr, ALONE):
        return 0
    if config.option.dist == "no":  # no --dist given: a module's slow tests share its fixtures
        config.option.dist = "loadfile" if may_select(markexpr, frozenset({"slow"})) else "worksteal"
    return min(len(os.sched_getaffinity(0)), 8)


# The modules with a test that needs a service CI starts (`_a_service_modules_turn`).
_SERVICE_MODULES = pytest.StashKey[set[str]]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that needs a service CI starts (all but root) belongs to the whole suite: the tier
    for a change (`-m "not slow"`) runs with no service, under CI=true too. A test marked `alone`
    is slow."""
    config.stash[_SERVICE_MODULES] = set()
    for item in items:
        needs_a_service = bool(_services(item) - {"root"})
        if needs_a_service:
            config.stash[_SERVICE_MODULES].add(item.module.__name__)
        if needs_a_service or item.get_closest_marker("alone"):
            item.add_marker(pytest.mark.slow)


def _services(node: pytest.Item) -> set[str]:
    return {m.args[0] for m in node.iter_markers("needs_service")}


# --- tests that share the host with another worker's ---------------------------------------
# On several workers (scripts/test.sh) two kinds of test take turns, each holding a lock the
# workers share (a file lock in a directory named by xdist's run id):
# - a test that needs root: every netns provisioning sweeps the clusters whose owner is gone
#   (infra/netns.py), so a test that checks its own sweep removed a dead cluster would find
#   another test's sweep had;
# - a module that uses a service CI starts (PostgreSQL, the SLURM clusters), for as long as its
#   fixtures live: a cluster's nodes and a database server's connections are shared.
# Tests marked `alone` run in a process of their own, after the others.

@contextlib.contextmanager
def _turn(name: str) -> Iterator[None]:
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run is None:  # one process: nothing beside it
        yield
        return
    folder = Path(tempfile.gettempdir()) / f"ddlbench-test-turns-{run}"
    folder.mkdir(exist_ok=True)
    with open(folder / name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    with _turn("root") if "root" in _services(item) else contextlib.nullcontext():
        return (yield)


@pytest.fixture(scope="module", autouse=True)
def _a_service_modules_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """Set up before the module's other fixtures and torn down after them."""
    if request.module.__name__ in request.config.stash.get(_SERVICE_MODULES, set()):
        with _turn("service"):
            yield
    else:
        yield


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("needs_service"):
        name, check = mark.args
        require_service(name, _ask(check))


@pytest.fixture(scope="session", autouse=True)
def _homes_under_the_test_root(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The deployment's home root is this session's temporary directory, where every test's home
    lies (pipelines/spec/trigger.py refuses a trigger's home outside it); a test of the refusal sets
    its own root."""
    os.environ.setdefault("DDLBENCH_HOME_ROOT", str(tmp_path_factory.getbasetemp()))


_exit_status: list[int] = []


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _exit_status.append(int(exitstatus))


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Leave without the interpreter's teardown once pytest has reported: with torch, MLflow and
    Airflow loaded it takes seconds, and nothing after this hook reads what it frees. A thread
    still running that would keep the interpreter alive is named, and the exit left to Python."""
    import sys
    import threading

    if "PYTEST_XDIST_WORKER" in os.environ:
        return  # a worker's last report to its controller may still be in flight
    left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()
            and not t.daemon]
    if left or not _exit_status:
        if left:
            sys.stderr.write(f"tests/conftest.py: threads still running at the end: {left}\n")
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status[-1])


def cmdline(p: psutil.Process) -> list[str]:
    """A process's command line; [] once it is gone or a zombie not yet reaped."""
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def warm_servers() -> list[psutil.Process]:
    """This process's warm-agent servers (infra/warm.py): its children serving a socket."""
    return [c for c in psutil.Process().children() if "--serve" in cmdline(c)]
