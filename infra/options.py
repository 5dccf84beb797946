"""Provider options as pydantic models: one model per provider is the one source of its
option names, defaults, checks and error messages, for `get_provider` and for a spec
that validates `provider.options` when it loads.

Errors name the option: "provider.options.nodes: expected an integer >= 1, got 0".
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from infra import bounds
from infra.base import ProviderError
from infra.placement import Policy

Opts = TypeVar("Opts", bound="ProviderOptions")


class ProviderOptions(BaseModel):
    """Base of every provider's options: unknown options are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads_per_process: int = Field(
        1, ge=1, le=bounds.THREADS.limit, description="Threads per rank (OMP_NUM_THREADS, torch threads).")

    @classmethod
    def parse(cls: type[Opts], options: Mapping[str, Any]) -> Opts:
        """The options validated, or a ProviderError naming each bad option."""
        try:
            return cls.model_validate(dict(options))
        except ValidationError as err:
            raise ProviderError(format_options_error(err, cls)) from None


def _where(loc: tuple[str | int, ...]) -> str:
    """('tolerations', 0) -> 'tolerations[0]'."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).removeprefix(".")


def format_options_error(err: ValidationError, model: type[ProviderOptions]) -> str:
    """One line per problem: `provider.options.field: problem`."""
    lines = []
    for e in err.errors():
        if e["type"] == "extra_forbidden":
            lines.append(f"provider.options: unexpected keyword argument {excerpt(e['loc'][-1])}; "
                         f"the options are {', '.join(model.model_fields)}")
        elif e["type"] == "value_error":
            lines.append(f"provider.options.{_where(e['loc'])}: {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"provider.options.{_where(e['loc'])}: {e['msg']} (got {excerpt(e.get('input'))})")
    return "\n".join(lines)


def integer_at_least(least: int, wording: str | None = None, optional: bool = False,
                     most: bounds.Bound | None = None) -> BeforeValidator:
    """An int option of at least `least` and at most `most` (or None, when `optional`)."""
    expected = wording or f"an integer >= {least}"

    def check(value: Any) -> Any:
        if optional and value is None:
            return value
        if not isinstance(value, int) or value < least:
            raise ValueError(f"expected {expected}, got {excerpt(value)}")
        if most is not None and value > most.limit:
            raise ValueError(f"{value:,} is above the bound of {most.limit:,} ({most.reason})")
        return value

    return BeforeValidator(check)


class PlacementOptions(ProviderOptions):
    """How a multi-node provider places a job's ranks (infra/placement.py, DESIGN §5)."""

    placement: Policy = Field(
        Policy.colocated,
        description="Parameter-server shards: colocated (spread over the worker nodes) or dedicated "
        "(on the last server_nodes nodes, which run no worker).",
    )
    devices_per_node: Annotated[int | None, integer_at_least(1, "a positive integer", optional=True,
                                                             most=bounds.DEVICES_PER_NODE)] = Field(
        None, description="Workers per node (one per device), filling nodes in order; default: spread evenly."
    )
    server_nodes: Annotated[int, integer_at_least(1, "a positive integer", most=bounds.NODES)] = Field(
        1, description="Nodes given to the shards with placement: dedicated."
    )


_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel, _EXCERPT.maxstring, _EXCERPT.maxother, _EXCERPT.maxlong = 2, 48, 48, 24
_EXCERPT.maxlist = _EXCERPT.maxtuple = _EXCERPT.maxdict = _EXCERPT.maxset = 4
EXCERPT_CHARS = 60


def excerpt(value: Any) -> str:
    """A bounded repr of a value for an error line: at most EXCERPT_CHARS characters, one line,
    whatever the value's size (an alias-expanded structure, a file's worth of text)."""
    text = _EXCERPT.repr(value)
    if len(text) > EXCERPT_CHARS:
        text = text[: EXCERPT_CHARS - 3] + "..."
    return text


def clip(text: str) -> str:
    """A one-line text (a path checked by `one_line`) cut to EXCERPT_CHARS characters."""
    return text if len(text) <= EXCERPT_CHARS else text[: EXCERPT_CHARS - 3] + "..."


# Values that reach a command line, a batch script or a cluster object: each is refused
# unless it matches the character set of the system that reads it, so no value can add a
# line to a script or a word to a command.
# C0 and C1 controls (U+0085 is a line break too), and the Unicode line and paragraph separators.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
SLURM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}")  # partition, account, job names
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1123 label (namespaces)
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# An OCI image reference: [registry[:port]/]path[:tag][@digest]
IMAGE_REF = re.compile(
    r"(?=.{1,255}$)([a-zA-Z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-]{1,2}[a-z0-9]+)*(/[a-z0-9]+([._-]{1,2}[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?"
)


def matching(pattern: re.Pattern[str], what: str) -> BeforeValidator:
    """A str option (or None) that must match `pattern` in full; `what` names the syntax."""

    def check(value: Any) -> Any:
        if value is not None and not (isinstance(value, str) and pattern.fullmatch(value)):
            raise ValueError(f"expected {what}, got {excerpt(value)}")
        return value

    return BeforeValidator(check)


def one_line(value: Any) -> Any:
    """A str (or path) option without control characters: no line breaks into a script or a log."""
    if value is not None and _CONTROL.search(str(value)):
        raise ValueError(f"must not hold control characters such as line breaks, got {excerpt(value)}")
    return value


OneLine = BeforeValidator(one_line)
