"""`ddlbench_hardware_onboarding`: characterise new hardware, triggered by hand.

Fill in the form (hardware label, provider, nodes, devices per node, network
bandwidth, models, algorithms, world sizes). Airflow checks every field against
its schema when the run is triggered; `start` then checks what spans fields
(world sizes that do not fit the nodes, the local provider on several nodes) and
the resulting spec, before anything runs. The run microbenchmarks the
communication, profiles the models, fits the performance model, predicts every
algorithm at every power-of-two world size up to 1024 workers, runs a few
validation trainings (the world sizes of the form, one repeat), sets them against
the form's reference hardware where it names one, and records the fitted hardware
profile (comm fits and layer tables) as an MLflow artifact of the parent run
(experiment `ddlbench-onboarding`) that other runs can predict from.
The spec building is pipelines/onboarding.py; this file is the form and the wiring.
"""

from __future__ import annotations

from airflow.sdk import Asset, Param, dag

from dags._common import DAG_ARGS, SPECS, benchmark
from pipelines import onboarding

ONBOARDING_REPORT = Asset(name="ddlbench_onboarding_report", uri="ddlbench://reports/onboarding")

# The form. Airflow validates every field against its schema when a run is triggered.
FORM = {
    "hardware_label": Param(
        "cpu-local", type="string", pattern=onboarding.LABEL_PATTERN, title="Hardware label",
        description="Name results are compared under: 1-64 letters, digits, '.', '-' or '_' "
                    "(no paths, spaces or shell characters)."),
    "provider": Param("local", type="string", enum=list(onboarding.PROVIDERS), title="Cluster provider"),
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
        examples=[list(onboarding.MODEL_EXAMPLES)], title="Models",
        description=f"One a line: {', '.join(onboarding.MODEL_EXAMPLES)}, or any torchvision classifier "
                    "by name. The GPT presets report tokens/s and MFU."),
    "dataset": Param(
        onboarding.AUTO_DATASET, type="string", minLength=1, title="Dataset",
        description="auto: the text corpus (stdlib-text) for a GPT preset, synthetic images otherwise; "
                    "or a dataset name for every model."),
    "algorithms": Param(
        list(onboarding.ALGORITHMS), type="array", minItems=1, uniqueItems=True,
        items={"type": "string", "enum": list(onboarding.ALGORITHMS)}, title="Algorithms"),
    "world_sizes": Param(
        [2], type="array", minItems=1, uniqueItems=True, items={"type": "integer", "minimum": 1},
        title="World sizes to train",
        description=f"Validation trainings; predictions go up to {onboarding.PREDICT_UP_TO} workers."),
    "reference_hardware": Param(
        None, type=["null", "string"], pattern=onboarding.LABEL_PATTERN, title="Reference hardware",
        description="A hardware label this hardware's report sets its throughput against, per "
                    "configuration both ran (that label's newest run in the onboarding experiment)."),
    "base_spec": Param(
        str(SPECS / "smoke.yaml"), type="string", minLength=1, title="Base spec",
        description="Spec giving everything the form does not (steps, batch sizes, ...)."),
    "home": Param(None, type=["null", "string"], title="ddlbench home"),
}


@dag(
    dag_id="ddlbench_hardware_onboarding",
    schedule=None,
    tags=["ddlbench", "onboarding"],
    doc_md=__doc__,
    **DAG_ARGS,
    params=FORM,
)
def ddlbench_hardware_onboarding() -> None:
    benchmark(onboarding.spec_of, ONBOARDING_REPORT, suite="onboarding", train_slots=FORM["nodes"].value)


ddlbench_hardware_onboarding()
