"""Reading the model's JSON inputs with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json(path: Path, what: str, error: type[Exception] = ValueError) -> dict[str, Any]:
    """The JSON object in `path`; `error` naming the file when it is missing (as `what`),
    not valid JSON or not an object."""
    path = Path(path)
    if not path.is_file():
        raise error(f"{path}: no such {what}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise error(f"{path}: not valid JSON, truncated? ({err.msg} at line {err.lineno})") from None
    if not isinstance(data, dict):
        raise error(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data
