"""Provider options as pydantic models: one model per provider is the one source of its
option names, defaults, checks and error messages, for `get_provider` and for a spec
that validates `provider.options` when it loads.

Errors name the option: "provider.options.nodes: expected an integer >= 1, got 0".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from infra.base import ProviderError
from infra.placement import Policy

Opts = TypeVar("Opts", bound="ProviderOptions")


class ProviderOptions(BaseModel):
    """Base of every provider's options: unknown options are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads_per_process: int = Field(1, description="Threads per rank (OMP_NUM_THREADS, torch threads).")

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
            lines.append(f"provider.options: unexpected keyword argument {e['loc'][-1]!r}; "
                         f"the options are {', '.join(model.model_fields)}")
        elif e["type"] == "value_error":
            lines.append(f"provider.options.{_where(e['loc'])}: {e['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"provider.options.{_where(e['loc'])}: {e['msg']} (got {e.get('input')!r})")
    return "\n".join(lines)


def integer_at_least(least: int, wording: str | None = None, optional: bool = False) -> BeforeValidator:
    """An int option of at least `least` (or None, when `optional`)."""
    expected = wording or f"an integer >= {least}"

    def check(value: Any) -> Any:
        if not (optional and value is None) and (not isinstance(value, int) or value < least):
            raise ValueError(f"expected {expected}, got {value!r}")
        return value

    return BeforeValidator(check)


class PlacementOptions(ProviderOptions):
    """How a multi-node provider places a job's ranks (infra/placement.py, DESIGN §5)."""

    placement: Policy = Field(
        Policy.colocated,
        description="Parameter-server shards: colocated (spread over the worker nodes) or dedicated "
        "(on the last server_nodes nodes, which run no worker).",
    )
    devices_per_node: Annotated[int | None, integer_at_least(1, "a positive integer", optional=True)] = Field(
        None, description="Workers per node (one per device), filling nodes in order; default: spread evenly."
    )
    server_nodes: Annotated[int, integer_at_least(1, "a positive integer")] = Field(
        1, description="Nodes given to the shards with placement: dedicated."
    )
