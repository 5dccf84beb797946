"""Warm agents: one interpreter per node, torch imported once, forks each job's agent on request.

A job's agent (infra/zygote.py) spends its start-up importing torch, its compiler stack and the
ranks' module: seconds on every job. Inside an `agents()` block (a pipeline run, a stage of
several jobs), the providers whose agents run on this host (local, netns) keep one server per
node, `python -m infra.zygote --serve SOCKET`, which imports them once. A job's launcher is then
`python -m infra.zygote --warm=SOCKET ...`, a client that imports nothing heavy: it hands the
server its command line, environment, working directory and standard streams, and the server
forks the agent, which runs exactly as the cold launcher would from there (its own process
group, the same log lines, its ranks forked fresh, a fresh process group per job). The client
waits for the agent's exit status and exits with it, so the provider sees the same process and
status a cold launcher gives.

A warm agent is only what a cold one would be: the server serves a request whose interpreter,
working directory and environment equal its own (an import may read any of them), and the client
runs cold otherwise, or when there is no server to reach. Lifetimes: the client dies with the
job's launcher (infra/lifeline.py), the server kills an agent whose client is gone (SIGKILL to
its process group), every agent dies with its server (PR_SET_PDEATHSIG), and the server with the
provider's process; SIGTERM or SIGINT to the client goes to the agent's process group, as to a
cold launcher's.
"""

from __future__ import annotations

import json
import os
import queue
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.lifeline import die_with_parent, exit_code, leave_now, wrap

_LENGTH = struct.Struct("!I")
MAX_REQUEST = 1 << 20  # a command line and an environment; more is no client of ours
READY_S = 5.0  # how long a provider waits for a new server's socket before going cold


def _request_of(argv: list[str]) -> dict:
    return {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "executable": sys.executable}


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        data += chunk
    return data


# --- the client: `python -m infra.zygote --warm=SOCKET ...` --------------------------------------


def run_warm(path: str, argv: list[str]) -> int | None:
    """Have the server at `path` fork this job's agent with `argv` (zygote's arguments, without
    --warm) and wait for it; the agent's exit status as a returncode (minus the signal), or None
    where the server cannot serve (none there, another environment, gone before the fork): the
    caller then runs cold. Nothing is started when None is returned."""
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
    except OSError:
        return None
    body = json.dumps(_request_of(argv)).encode()
    try:
        socket.send_fds(conn, [_LENGTH.pack(len(body)) + body], [0, 1, 2])
        reply = conn.makefile("rb")
        first = json.loads(reply.readline() or b"{}")
    except (OSError, ValueError):
        return None
    if "pid" not in first:
        return None  # refused ("cold": why), or the server died before forking
    agent = first["pid"]

    def forward(sig: int, _frame: object) -> None:
        try:
            os.killpg(agent, sig)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            line = reply.readline()
            break
        except InterruptedError:
            continue
    try:
        return int(json.loads(line)["exit"])
    except (ValueError, KeyError, TypeError):
        # The server died with the agent still running: the agent dies with it (its lifeline).
        return -int(signal.SIGKILL)


def exit_as(code: int) -> None:
    """Leave with `code` as a returncode reads it: minus a signal is death by that signal."""
    if code < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        if -code != signal.SIGKILL:  # the only one of these a process cannot take back
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)  # a signal this process blocks or ignores: leave as a shell reports it
        os._exit(128 - code)
    leave_now(code & 0xFF)


# --- the server: `python -m infra.zygote --serve SOCKET` ----------------------------------------


@dataclass
class _Agent:
    pid: int
    pidfd: int
    conn: socket.socket


class Server:
    """Forks agents on request, each running `agent_main(argv)`; single-threaded (it forks)."""

    def __init__(self, path: str, preload: Callable[[str | None], None],
                 agent_main: Callable[[list[str]], int]) -> None:
        self.path, self.preload, self.agent_main = path, preload, agent_main
        self.own = _request_of([])  # what an import here may have read
        self.sel = selectors.DefaultSelector()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.agents: dict[int, _Agent] = {}  # by pidfd
        self.by_conn: dict[socket.socket, _Agent] = {}
        self.pid = os.getpid()

    def serve(self) -> None:
        # Bound before the imports: a client that comes early waits in the backlog.
        self.listener.bind(self.path)
        self.listener.listen(64)
        self.preload(None)
        self.sel.register(self.listener, selectors.EVENT_READ)
        while True:
            for key, _ in self.sel.select():
                if key.fileobj is self.listener:
                    self._accept()
                elif isinstance(key.fileobj, int):
                    self._reap(self.agents[key.fileobj])
                else:
                    self._client_gone(key.fileobj)

    def stop(self) -> None:
        """Every live agent's group SIGTERMed, then SIGKILLed; the socket removed."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for agent in self.agents.values():
                try:
                    os.killpg(agent.pid, sig)
                except ProcessLookupError:
                    pass
            if sig == signal.SIGTERM and self.agents:
                time.sleep(0.5)
        Path(self.path).unlink(missing_ok=True)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        fds: list[int] = []
        try:
            conn.settimeout(5.0)  # a client sends its request at once
            msg, fds, _, _ = socket.recv_fds(conn, _LENGTH.size + 65536, 3)
            if len(msg) < _LENGTH.size:
                raise ConnectionError("no request")
            (length,) = _LENGTH.unpack(msg[:_LENGTH.size])
            if length > MAX_REQUEST or len(fds) != 3:
                raise ConnectionError("not a request")
            body = msg[_LENGTH.size:]
            body += _recv_exact(conn, length - len(body))
            request = json.loads(body)
            conn.settimeout(None)
        except (OSError, ValueError):
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        differs = [k for k in ("executable", "cwd", "env") if request.get(k) != self.own[k]]
        if differs:
            conn.sendall(json.dumps({"cold": f"another {' and '.join(differs)} than the server's"}).encode() + b"\n")
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        argv = request["argv"]
        self.preload(argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            self._become_agent(conn, fds, argv)
        for fd in fds:
            os.close(fd)  # the agent holds the job's streams now: their readers see its end
        agent = _Agent(pid, os.pidfd_open(pid), conn)
        self.agents[agent.pidfd] = agent
        self.by_conn[conn] = agent
        self.sel.register(agent.pidfd, selectors.EVENT_READ)
        self.sel.register(conn, selectors.EVENT_READ)  # readable only when the client is gone
        conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")

    def _become_agent(self, conn: socket.socket, fds: list[int], argv: list[str]) -> None:
        """In the fork: the job's agent, as `python -m infra.zygote ARGV` would be; never returns."""
        code = 1
        try:
            os.setpgid(0, 0)  # a group of its own, as a cold launcher's session: signalled whole
            die_with_parent(self.pid)
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for agent in self.agents.values():
                os.close(agent.pidfd)
                agent.conn.close()
            self.sel.close()
            self.listener.close()
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            _retitle(argv)
            code = self.agent_main(argv)
        except SystemExit as err:
            code = exit_code(err)
        except BaseException:  # noqa: BLE001  (the agent's traceback goes to the job's log)
            traceback.print_exc()
        finally:
            leave_now(code)

    def _reap(self, agent: _Agent) -> None:
        _, status = os.waitpid(agent.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        self._forget(agent)
        try:
            agent.conn.sendall(json.dumps({"exit": code}).encode() + b"\n")
        except OSError:
            pass
        agent.conn.close()

    def _client_gone(self, conn: socket.socket) -> None:
        agent = self.by_conn.get(conn)
        try:
            alive = bool(conn.recv(4096, socket.MSG_DONTWAIT))  # a client sends nothing more: dropped
        except BlockingIOError:
            alive = True
        except OSError:
            alive = False
        if alive or agent is None:
            return
        self.sel.unregister(conn)
        del self.by_conn[conn]
        try:
            os.killpg(agent.pid, signal.SIGKILL)  # its launcher died: so does the job
        except ProcessLookupError:
            pass

    def _forget(self, agent: _Agent) -> None:
        self.sel.unregister(agent.pidfd)
        os.close(agent.pidfd)
        del self.agents[agent.pidfd]
        if self.by_conn.pop(agent.conn, None) is not None:
            self.sel.unregister(agent.conn)


def _retitle(argv: list[str]) -> None:
    """The agent's (and so its ranks') command line as a cold launcher's: ps, and whoever looks
    for a job's processes by its arguments, see the job, not the server."""
    import setproctitle

    setproctitle.setproctitle(" ".join([sys.executable, "-m", "infra.zygote", *argv]))


def serve(path: str, preload: Callable[[str | None], None], agent_main: Callable[[list[str]], int]) -> int:
    server = Server(path, preload, agent_main)

    def stop(sig: int, _frame: object) -> None:
        raise SystemExit(128 + sig)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    try:
        server.serve()
    except (SystemExit, KeyboardInterrupt):
        pass
    finally:
        server.stop()
    leave_now(0)  # the block's end waits on the server: not on the interpreter's teardown of torch


# --- the provider's side -------------------------------------------------------------------------


@dataclass
class _Running:
    proc: subprocess.Popen
    path: str
    env: dict[str, str]


class WarmAgents:
    """The warm servers of one `agents()` block, one per node, started on a node's first job with
    that job's environment (and started again for a job with another one)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ddlbench-warm-"))
        self.servers: dict[str, _Running] = {}
        self.started = 0
        # Servers are started from one thread that lives as long as the pool: a server dies with
        # the thread that started it (PR_SET_PDEATHSIG is a thread's), and jobs run from any. A
        # daemon: a process that leaves with a pool open is not held by it (its servers die with it).
        self.requests: queue.SimpleQueue[tuple[Callable[[], Any], Future] | None] = queue.SimpleQueue()
        threading.Thread(target=self._spawn, name="warm-agents", daemon=True).start()

    def _spawn(self) -> None:
        while (request := self.requests.get()) is not None:
            start, done = request
            try:
                done.set_result(start())
            except BaseException as err:  # noqa: BLE001  (the caller's to raise)
                done.set_exception(err)

    def _in_spawner(self, start: Callable[[], Any]) -> Any:
        done: Future = Future()
        self.requests.put((start, done))
        return done.result()

    def socket_for(self, node: str, env: dict[str, str], prefix: list[str] | None = None) -> str | None:
        """The socket of `node`'s server for jobs with `env`; None where none could start (the
        job then runs cold). `prefix` runs the server where the node's agents run (`ip netns exec`)."""
        running = self.servers.get(node)
        if running is not None and (running.env != env or running.proc.poll() is not None):
            self._stop(node)
            running = None
        if running is None:
            self.started += 1
            path = str(self.dir / f"{self.started}.sock")
            argv = wrap([*(prefix or []), sys.executable, "-m", "infra.zygote", "--serve", path])
            with open(self.dir / f"{Path(path).stem}.log", "ab") as log:
                proc = self._in_spawner(lambda: subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                                                 stderr=log, start_new_session=True))
            running = self.servers[node] = _Running(proc, path, env)
            deadline = time.monotonic() + READY_S
            while not os.path.exists(path) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        return running.path if os.path.exists(running.path) else None

    def _stop(self, node: str) -> None:
        running = self.servers.pop(node)
        if running.proc.poll() is None:
            running.proc.terminate()
            try:
                running.proc.wait(5)
            except subprocess.TimeoutExpired:
                running.proc.kill()
                running.proc.wait()
        Path(running.path).unlink(missing_ok=True)

    def close(self) -> None:
        for node in list(self.servers):
            self._stop(node)
        self.requests.put(None)
        for p in self.dir.iterdir():
            p.unlink(missing_ok=True)
        self.dir.rmdir()


_active: WarmAgents | None = None


_kept = False  # the active pool is `keep()`'s, open until `release()` or the process's end


@contextmanager
def agents() -> Iterator[WarmAgents | None]:
    """Inside, jobs launched from this process on the local and netns providers fork their agents
    from one warm server per node (`socket_for`); the servers stop on leaving. A block inside
    another, or inside `keep()`, shares that pool."""
    global _active
    if _active is not None:
        yield _active
        return
    _active = WarmAgents()
    try:
        yield _active
    finally:
        pool, _active = _active, None
        pool.close()


def keep() -> None:
    """Warm agents from now until `release()` (or this process's end, its servers with it), for
    work whose jobs run in steps that no one block holds: an Airflow DAG run's tasks, which
    `airflow dags test` runs in one process, the scheduler each in its own."""
    global _active, _kept
    if _active is None:
        _active, _kept = WarmAgents(), True


def release() -> None:
    """Stop `keep()`'s servers (a block's are its own to stop)."""
    global _active, _kept
    if _kept and _active is not None:
        pool, _active, _kept = _active, None, False
        pool.close()


def server_pids() -> list[int]:
    """The running servers of this process's pool: their reaped agents' CPU is this process's work
    (infra/hostload.py)."""
    if _active is None:
        return []
    return [r.proc.pid for r in _active.servers.values() if r.proc.poll() is None]


def socket_for(node: str, env: dict[str, str], prefix: list[str] | None = None) -> str | None:
    """The warm server's socket for an agent on `node` with `env`; None outside `agents()`."""
    return None if _active is None else _active.socket_for(node, env, prefix)
