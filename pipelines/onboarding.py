"""The hardware-onboarding run's spec, from the onboarding DAG's form (dags/ddlbench_hardware_onboarding.py).

The form gives a hardware label, a provider and its shape, a link rate, models, algorithms and
world sizes; `overrides` turns them into spec overrides of the base spec, checking what the
form's schema cannot (fields that constrain each other). Imports nothing heavy: the DAG file
reads the choices below when Airflow parses it.
"""

from __future__ import annotations

from typing import Any

from training.gpt_shape import GPT_PRESETS, is_gpt

# The cluster providers (infra.PROVIDER_NAMES; tests/test_dags.py holds the two together).
PROVIDERS = ("local", "netns", "slurm", "kubernetes")
# A form's algorithm choice -> the spec's algorithm entry.
ALGORITHMS: dict[str, dict[str, str]] = {
    "ssgd": {"name": "ssgd", "comm": "allreduce"},
    "ssgd-ps": {"name": "ssgd", "comm": "ps"},
    "asgd": {"name": "asgd", "comm": "ps"},
    "odsgd": {"name": "odsgd", "comm": "ps"},
}
# The models the form suggests: ddlbench's own CNNs, a torchvision classifier, the GPT presets.
# Any model ddlbench trains is accepted (the spec's check names one it does not know).
MODEL_EXAMPLES: tuple[str, ...] = ("lenet5", "resnet20", "mobilenet_v3_small", *GPT_PRESETS)
# The dataset `auto`: a GPT preset trains on the text corpus, an image model on synthetic images.
AUTO_DATASET = "auto"
PREDICT_UP_TO = 1024  # workers: predictions go to every power of two up to this
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class OnboardingError(ValueError):
    """The form's values do not make a valid onboarding run; the message names the field."""


def _provider_options(params: dict[str, Any]) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if params["provider"] != "local":  # one worker per device, filling nodes in order (infra/placement.py)
        options |= {"nodes": params["nodes"], "devices_per_node": params["devices_per_node"]}
    if params["provider"] == "netns":  # it shapes its emulated links to this rate
        options["bandwidth"] = f"{params['bandwidth_gbps']:g}gbit"
    return options


def overrides(params: dict[str, Any]) -> dict[str, Any]:
    """The spec overrides of a filled-in form, or OnboardingError naming the field.

    Airflow has already checked each field against its schema; this checks what
    the schema cannot: fields that constrain each other.
    """
    nodes, per_node = params["nodes"], params["devices_per_node"]
    if params["provider"] == "local" and nodes != 1:
        raise OnboardingError(f"nodes: the local provider runs on this one host; got {nodes} nodes")
    too_big = [w for w in params["world_sizes"] if w > nodes * per_node]
    if too_big:
        raise OnboardingError(f"world_sizes: {too_big} exceed nodes x devices_per_node = "
                              f"{nodes} x {per_node} = {nodes * per_node}")
    reference = params.get("reference_hardware")
    if reference is not None and reference == params["hardware_label"]:
        raise OnboardingError(f"reference_hardware: {reference!r} is the hardware being onboarded; name the "
                              "hardware to compare it against")
    measured = sorted(set(params["world_sizes"]))
    what_if = [2**k for k in range(PREDICT_UP_TO.bit_length()) if 2**k not in measured]
    return {
        "name": f"onboarding-{params['hardware_label']}",
        "suite": "onboarding",
        "hardware": params["hardware_label"],
        "provider": {"name": params["provider"], "options": _provider_options(params)},
        "workloads": [{"model": m, "dataset": dataset_for(m, params["dataset"])} for m in params["models"]],
        "algorithms": [ALGORITHMS[a] for a in params["algorithms"]],
        "workers": measured,
        "repeats": 1,
        "network": {"link_bandwidth": f"{params['bandwidth_gbps']:g}gbit"},
        "what_if": {"workers": what_if},
        **({"regression": {"reference_hardware": reference}} if reference else {}),
    }


def dataset_for(model: str, dataset: str) -> str:
    """The form's dataset for one of its models: `auto` picks by the kind of model."""
    if dataset != AUTO_DATASET:
        return dataset
    return "stdlib-text" if is_gpt(model) else "synthetic"


def spec_of(params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The base spec and the form's overrides of it."""
    return params["base_spec"], overrides(params)
