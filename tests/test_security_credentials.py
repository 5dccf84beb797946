"""Credentials never reach MLflow params, tags or artifacts, the run directory or the logs
(issue 38): a real `ddlbench run` against a real MLflow server whose tracking URI carries a
password, and the same URI while the server is down."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.credentials import mask_secrets
from pipelines.spec import SpecError, load_spec
from pipelines.tracking import Tracker
from pipelines.tracking.uri import mask_uri, resolve_uri

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"
PASSWORD = "Canary-S3cret-7f3e"
MLFLOW = str(Path(sys.executable).with_name("mlflow"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(scheme=st.sampled_from(["postgresql", "postgresql+psycopg2", "mysql+pymysql", "http", "https"]),
       password=st.text(alphabet=st.characters(blacklist_categories=["Cs", "Cc", "Zs", "Zl", "Zp"],
                                               blacklist_characters="/@#?"), min_size=1, max_size=30),
       host=st.sampled_from(["127.0.0.1", "db.example", "[::1]", "db"]))
def test_every_url_password_is_masked(scheme: str, password: str, host: str) -> None:
    secret = "PW" + password
    uri = f"{scheme}://user:{secret}@{host}:5432/store?sslmode=require"
    masked = mask_uri(uri)
    assert masked == f"{scheme}://user:***@{host}:5432/store?sslmode=require"
    assert secret not in mask_secrets(f"MlflowException: API request to {uri}/api failed")


def test_keyword_passwords_and_tokens_are_masked() -> None:
    for text, expected in [("host=db password=hunter2 user=x", "host=db password=*** user=x"),
                           ("postgresql://db/x?sslpassword=zz&a=1", "postgresql://db/x?sslpassword=***&a=1"),
                           ("https://h/api?token=abc", "https://h/api?token=***"),
                           ("sqlite:////tmp/mlflow.db", "sqlite:////tmp/mlflow.db")]:
        assert mask_secrets(text) == expected


CREDENTIAL_KEYS = ["api_key", "apikey", "access_key", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token",
                   "sig", "signature", "auth", "private_key", "client_secret", "token", "password"]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(key=st.sampled_from(CREDENTIAL_KEYS), value=st.text(alphabet="abcdefXYZ0123456789%+/=-_.~", min_size=1,
                                                          max_size=40),
       place=st.sampled_from(["?{}", "?a=1&{}", "?a=1;{}", " {}"]))
def test_every_credential_named_query_key_is_masked(key: str, value: str, place: str) -> None:
    secret = "Qv" + value.replace("=", "")  # a prefix no key holds
    text = "https://bucket.example/obj" + place.format(f"{key}={secret}") + "&b=2"
    masked = mask_secrets(text)
    assert secret not in masked and f"{key}=***" in masked, masked


@settings(max_examples=100, deadline=None, derandomize=True)
@given(token=st.text(alphabet=st.characters(blacklist_categories=["Cs", "Cc", "Zs", "Zl", "Zp"],
                                            blacklist_characters="/@#?:"), min_size=1, max_size=40),
       scheme=st.sampled_from(["http", "https", "postgresql", "git+https"]))
def test_a_userinfo_without_a_password_is_masked_whole(token: str, scheme: str) -> None:
    """https://TOKEN@host: a userinfo without a colon may be a token; it is masked, host kept."""
    masked = mask_uri(f"{scheme}://T{token}@db.example:5000/x")
    assert masked == f"{scheme}://***@db.example:5000/x"


def test_words_that_only_look_like_credentials_are_kept() -> None:
    for text in ("author=me design=3 config=x", "http://127.0.0.1:5000", "file:///tmp/mlflow.db"):
        assert mask_secrets(text) == text


def test_a_spec_holding_a_password_is_refused_naming_the_field() -> None:
    with pytest.raises(SpecError) as err:
        load_spec(SMOKE, {"provider": {"name": "kubernetes",
                                       "options": {"api_server": f"https://admin:{PASSWORD}@10.0.0.1:6443"}}})
    assert str(err.value).startswith("smoke.yaml.provider.options.api_server: holds a password or token")
    assert PASSWORD not in str(err.value)


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """A real MLflow tracking server (SQLite behind it, artifacts served through it)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = _free_port()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen([MLFLOW, "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", str(port), "--workers", "1"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                time.sleep(1)
        else:
            pytest.fail(f"mlflow server did not start: {(root / 'server.log').read_text()[-2000:]}")
        yield {"root": root, "uri": f"http://canary:{PASSWORD}@127.0.0.1:{port}", "port": port}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:  # its workers may linger past SIGTERM
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)
        log.close()


def _holding(root: Path, secret: str) -> list[str]:
    """Every file under root whose bytes hold the secret."""
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_with_a_password_in_its_tracking_uri_stores_it_nowhere(mlflow_server: dict, tmp_path: Path) -> None:
    from mlflow import MlflowClient

    home = tmp_path / "home"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    sets = ["algorithms=[{name: ssgd}]", "steps=10", "microbench.enabled=false", "profile.enabled=false",
            "target_accuracy=null", "train.eval_every=0", "what_if.workers=[]"]
    argv = [sys.executable, "-c", "from pipelines.cli import main; main()", "run", str(SMOKE), "--home", str(home),
            "--tracking-uri", str(mlflow_server["uri"]), "--run-key", "credentials"]
    for s in sets:
        argv += ["--set", s]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=540)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert PASSWORD not in done.stdout + done.stderr
    assert "canary:***@" in done.stdout  # the CLI names the store, masked
    assert _holding(home, PASSWORD) == []  # run directory, journal, ctx.json, logs, summaries
    assert _holding(Path(mlflow_server["root"]), PASSWORD) == []  # the store's database and artifacts

    client = MlflowClient(tracking_uri=str(mlflow_server["uri"]))
    experiment = client.get_experiment_by_name("ddlbench-adhoc")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    assert len(runs) >= 2 and {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        values = [*run.data.params.values(), *run.data.tags.values(), *run.data.params, *run.data.tags]
        assert not [v for v in values if PASSWORD in v], run.info.run_name


def test_a_store_that_is_down_is_named_masked_in_the_log(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The error MLflow raises for an unreachable server quotes the URI whole; the warning,
    `last_error` and the journal hold it masked."""
    uri = f"http://canary:{PASSWORD}@127.0.0.1:{_free_port()}"
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert resolve_uri(mask_uri(uri)) == uri  # the masked form finds its credentials in the environment
    tracker = Tracker(tmp_path / "run", uri, "ddlbench-adhoc", "down")
    with caplog.at_level(logging.WARNING):
        tracker.start_run("pipeline", "down", parent=None, tags={"store": uri})
        tracker.log_params("pipeline", {"database": f"postgresql://u:{PASSWORD}@db/x", "ok": 1})
    assert tracker.last_error is not None and "MLflow unavailable" in caplog.text
    assert PASSWORD not in caplog.text and PASSWORD not in tracker.last_error
    assert _holding(tmp_path / "run", PASSWORD) == []
    assert "u:***@db" in (tmp_path / "run" / "journal.jsonl").read_text()
