"""A new SQLite MLflow store, copied from an empty one.

MLflow gives a new SQLite store its schema by running every one of its migrations, seconds of a
run's start on a small host; the schema of an empty store is the same for every store of one
MLflow version. So the first new store of a version on a machine is made by MLflow into a
template (under the user's cache directory), and every later one is a copy of it. The copy is
published under the store's name with a hard link, which fails where another process has made
the store meanwhile: a store that exists is never replaced. Where the cache cannot be written,
MLflow makes the store as before. The copy's Default experiment, which ddlbench never uses (a
run goes to its suite's experiment), keeps the artifact location the template was made with.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import uuid
from pathlib import Path

SQLITE = "sqlite:///"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ddlbench"


def sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI (`sqlite:////abs/path.db`); None for another
    store or a URI with options."""
    if not uri.startswith(SQLITE) or "?" in uri:
        return None
    return Path(uri.removeprefix(SQLITE))


def _beside(path: Path) -> Path:
    """A name no other process uses, in `path`'s folder: a file is made there, then moved or
    linked to `path` whole."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")


def _template() -> Path:
    """This MLflow version's empty store, made by MLflow once per machine."""
    template = cache_dir() / f"mlflow-{importlib.metadata.version('mlflow')}-empty.db"
    if template.exists():
        return template
    import mlflow  # here, not at the top: the DAG files import the tracking package at parse time

    template.parent.mkdir(parents=True, exist_ok=True)
    tmp = _beside(template)  # MLflow makes the file itself
    try:
        mlflow.MlflowClient(tracking_uri=f"{SQLITE}{tmp}").search_experiments()
        os.replace(tmp, template)  # another process's template is the same schema
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    return template


def prepare(uri: str) -> None:
    """Make the SQLite store of `uri` from the template when it does not exist yet; nothing for
    another store, an existing one, or where the template cannot be made."""
    path = sqlite_path(uri)
    if path is None or path.exists() or not path.parent.is_dir():
        return
    try:
        template = _template()
    except Exception:  # noqa: BLE001 - no template: MLflow makes the store itself, as without one
        return
    tmp = _beside(path)  # copied into a new file: the umask's mode, as MLflow's own store has
    try:
        shutil.copyfile(template, tmp)
        with contextlib.suppress(FileExistsError):  # made meanwhile: that one stays
            os.link(tmp, path)
    except OSError:
        return
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
