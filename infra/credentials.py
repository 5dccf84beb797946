"""What a log, an MLflow param or tag, a run directory or a refusal may hold of a credential:
the one masking of URLs' secrets and credential-like values (docs/security.md). On the lowest
floor, so that the spec's check (no password in a spec), the tracking and the providers mask alike."""

from __future__ import annotations

import re

MASK = "***"


# The userinfo of any URL (up to the last '@' of its authority): user:password@ keeps the user,
# a userinfo without a colon may be a token (https://TOKEN@host) and is masked whole.
_URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^:/@\s]*):[^\s/]*@")
_URL_TOKEN = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^:/@\s]+@")
# Values of query or keyword keys named like credentials: password=, sslpassword=, token=, api_key=,
# sig=, X-Amz-Signature=, X-Amz-Credential=, X-Amz-Security-Token=, access_key=, ...
_SECRET_VALUE = re.compile(
    r"(?i)\b([a-z0-9_.-]*(?:password|passwd|pwd|token|secret|api[_-]?key|access[_-]?key|private[_-]?key|"
    r"signature|sig|credential|credentials|auth))=([^&\s;,'\"]+)"
)


def mask_secrets(text: str) -> str:
    """`text` with every URL's userinfo secret and every credential-like `key=value` masked: what
    params, tags, the run directory and logs hold of a tracking or database URI."""
    text = _URL_CREDENTIALS.sub(lambda m: f"{m[1]}{m[2]}:{MASK}@", text)
    text = _URL_TOKEN.sub(lambda m: f"{m[1]}{MASK}@", text)
    return _SECRET_VALUE.sub(lambda m: f"{m[1]}={MASK}", text)
