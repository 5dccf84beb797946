"""A copy of a pipeline's home (run directories, MLflow store, artifacts) that a test may change
without touching the original: shared by the tests that start from one module-wide run."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path


def copy_home(old: Path, home: Path) -> Path:
    """`old` copied to `home`, every path it records (ctx.json, the steps' outputs, the store's
    artifact locations) moved into the copy."""
    shutil.copytree(old, home)
    for path in (home / "runs").rglob("*.json"):
        text = path.read_text()
        if str(old) in text:
            path.write_text(text.replace(str(old), str(home)))
    with sqlite3.connect(home / "mlflow.db") as db:
        db.execute("UPDATE experiments SET artifact_location = replace(artifact_location, ?, ?)", (str(old), str(home)))
        db.execute("UPDATE runs SET artifact_uri = replace(artifact_uri, ?, ?)", (str(old), str(home)))
    db.close()
    return home
