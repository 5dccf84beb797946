"""`ddlbench_hardware_onboarding`: characterise new hardware, triggered by hand.

Fill in the form (hardware label, provider, nodes, devices per node, network
bandwidth, models, algorithms, world sizes). Airflow checks every field against
its schema when the run is triggered; `start` then checks what spans fields
(world sizes that do not fit the nodes, the local provider on several nodes) and
the resulting spec, before anything runs. The run microbenchmarks the
communication, profiles the models, fits the performance model, predicts every
algorithm at every power-of-two world size up to 1024 workers, runs a few
validation trainings (the world sizes of the form, one repeat) and records the
fitted hardware profile (comm fits and layer tables) as an MLflow artifact of
the parent run (experiment `ddlbench-onboarding`) that other runs can predict from.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, Param, dag, task

from dags._common import DEFAULT_ARGS, SPECS, START_DATE, airflow_info, benchmark, run_key

ONBOARDING_REPORT = Asset(name="ddlbench_onboarding_report", uri="ddlbench://reports/onboarding")

PROVIDERS = ["local", "netns", "slurm", "kubernetes"]
# Form choice -> the spec's algorithm entry.
ALGORITHMS: dict[str, dict[str, str]] = {
    "ssgd": {"name": "ssgd", "comm": "allreduce"},
    "ssgd-ps": {"name": "ssgd", "comm": "ps"},
    "asgd": {"name": "asgd", "comm": "ps"},
    "odsgd": {"name": "odsgd", "comm": "ps"},
}
PREDICT_UP_TO = 1024
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


# The form. Airflow validates every field against its schema when a run is triggered.
FORM = {
    "hardware_label": Param(
        "cpu-local", type="string", pattern=LABEL_PATTERN, title="Hardware label",
        description="Name results are compared under: 1-64 letters, digits, '.', '-' or '_' "
                    "(no paths, spaces or shell characters)."),
    "provider": Param("local", type="string", enum=PROVIDERS, title="Cluster provider"),
    "nodes": Param(1, type="integer", minimum=1, maximum=4096, title="Nodes"),
    "devices_per_node": Param(
        2, type="integer", minimum=1, maximum=64, title="Devices per node",
        description="Accelerators (or CPU ranks) per node."),
    "bandwidth_gbps": Param(
        100.0, type="number", exclusiveMinimum=0, title="Network bandwidth (Gbit/s)",
        description="Link rate between nodes (on one host: above its loopback rate), recorded "
                    "and a physical bound of the comm fit: a faster fit is flagged."),
    "models": Param(
        ["lenet5"], type="array", minItems=1, items={"type": "string", "minLength": 1},
        title="Models"),
    "dataset": Param("synthetic", type="string", minLength=1, title="Dataset"),
    "algorithms": Param(
        list(ALGORITHMS), type="array", minItems=1, uniqueItems=True,
        items={"type": "string", "enum": list(ALGORITHMS)}, title="Algorithms"),
    "world_sizes": Param(
        [2], type="array", minItems=1, uniqueItems=True, items={"type": "integer", "minimum": 1},
        title="World sizes to train",
        description=f"Validation trainings; predictions go up to {PREDICT_UP_TO} workers."),
    "base_spec": Param(
        str(SPECS / "smoke.yaml"), type="string", minLength=1, title="Base spec",
        description="Spec giving everything the form does not (steps, batch sizes, ...)."),
    "home": Param(None, type=["null", "string"], title="ddlbench home"),
}


class OnboardingError(ValueError):
    """The form's values do not make a valid onboarding run; the message names the field."""


def onboarding_overrides(params: dict[str, Any]) -> dict[str, Any]:
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
    measured = sorted(set(params["world_sizes"]))
    what_if = [2**k for k in range(PREDICT_UP_TO.bit_length()) if 2**k not in measured]
    provider_options: dict[str, Any] = {}
    if params["provider"] != "local":  # one worker per device, filling nodes in order (infra/placement.py)
        provider_options |= {"nodes": nodes, "devices_per_node": per_node}
    if params["provider"] == "netns":  # it shapes its emulated links to this rate
        provider_options["bandwidth"] = f"{params['bandwidth_gbps']:g}gbit"
    return {
        "name": f"onboarding-{params['hardware_label']}",
        "suite": "onboarding",
        "hardware": params["hardware_label"],
        "provider": {"name": params["provider"], "options": provider_options},
        "workloads": [{"model": m, "dataset": params["dataset"]} for m in params["models"]],
        "algorithms": [ALGORITHMS[a] for a in params["algorithms"]],
        "workers": measured,
        "repeats": 1,
        "network": {"link_bandwidth": f"{params['bandwidth_gbps']:g}gbit"},
        "what_if": {"workers": what_if},
    }


@task(task_id="start", retries=0)
def start(params: dict | None = None) -> dict:
    """Check the form, build and validate the spec, open the parent MLflow run."""
    from pipelines import steps

    assert params is not None
    return steps.start(params["base_spec"], run_key=run_key(), home=params["home"],
                       overrides=onboarding_overrides(params), airflow=airflow_info())


@task(task_id="record_hardware_profile")
def record_hardware_profile(ctx: dict) -> dict:
    """Log the comm fits and layer tables as one artifact other runs can predict from."""
    from pipelines import steps

    return steps.record_hardware_profile(ctx)


@dag(
    dag_id="ddlbench_hardware_onboarding",
    schedule=None,
    start_date=START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    tags=["ddlbench", "onboarding"],
    doc_md=__doc__,
    params=FORM,
)
def ddlbench_hardware_onboarding() -> None:
    ctx = start()
    tasks = benchmark(ctx, ONBOARDING_REPORT, train_slots=FORM["nodes"].value)
    tasks["fit"] >> record_hardware_profile(ctx) >> tasks["report"]


ddlbench_hardware_onboarding()
