"""What a DAG trigger may choose (issue 38): spec paths inside the deployment's spec
directories, homes inside its home root, no deployment-only field in the overrides; refused
at `start` with one line naming the Param or field, before any file is read or written."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra import provider_options_model
from pipelines import steps
from pipelines.spec import SpecError, load_spec
from pipelines.spec.trigger import HOME_ROOT_ENV, SPEC_DIRS_ENV, TRIGGER_FIELDS, check_trigger, check_trigger_overrides

REPO = Path(__file__).resolve().parent.parent
SMOKE = REPO / "specs" / "smoke.yaml"
AIRFLOW = {"dag_id": "ddlbench_nightly", "run_id": "manual__1", "task_id": "start", "try_number": 1}
# What the provider options a trigger may set are: sizes and links.
TRIGGER_OPTIONS = {"nodes", "devices_per_node", "gpus_per_node", "bandwidth", "placement", "server_nodes"}


@pytest.fixture()
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOME_ROOT_ENV, str(tmp_path / "homes"))
    monkeypatch.delenv(SPEC_DIRS_ENV, raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "homes").mkdir()
    return tmp_path


def refused(call: Any, *expected: str) -> str:
    with pytest.raises(SpecError) as err:
        call()
    text = str(err.value)
    assert "\n" not in text and all(e in text for e in expected), text
    return text


def test_spec_paths_outside_the_spec_directories_are_refused_unread(root: Path) -> None:
    home = str(root / "homes" / "a")
    text = refused(lambda: check_trigger("/etc/shadow", home, None), "spec_path: '/etc/shadow' is outside")
    assert str(REPO / "specs") not in text and SPEC_DIRS_ENV in text  # the field, not the deployment's layout
    for sneaky in (f"{REPO}/specs/../pipelines/spec/__init__.py", "specs/smoke.yaml\x00", "", "../../etc/passwd"):
        refused(lambda p=sneaky: check_trigger(p, home, None), "spec_path")
    check_trigger(str(SMOKE), home, None)  # the repository's specs are the deployment's


def test_a_link_out_of_an_added_spec_directory_is_refused(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = root / "deployment-specs"
    mine.mkdir()
    (mine / "ok.yaml").write_text(SMOKE.read_text())
    secret = root / "secret.txt"
    secret.write_text("root:$6$hash:20593:0:99999:7:::\n")
    (mine / "link.yaml").symlink_to(secret)
    home = str(root / "homes" / "a")
    refused(lambda: check_trigger(str(mine / "ok.yaml"), home, None), "outside the deployment's spec directories")
    monkeypatch.setenv(SPEC_DIRS_ENV, str(mine))
    check_trigger(str(mine / "ok.yaml"), home, None)
    refused(lambda: check_trigger(str(mine / "link.yaml"), home, None), "spec_path", "is outside")


def test_a_home_outside_the_root_is_refused_naming_home(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for home in ("/etc", str(root / "homes" / ".." / "elsewhere")):
        refused(lambda h=home: check_trigger(str(SMOKE), h, None), "home: ", "outside the deployment's home root")
    for home in ("/tmp\necho x", f"{root}/homes/a\u2028b", f"{root}/homes/a\x85b", f"{root}/homes/a\x9bb"):
        refused(lambda h=home: check_trigger(str(SMOKE), h, None), "home: must not hold control characters")
    check_trigger(str(SMOKE), str(root / "homes" / "nightly"), None)
    check_trigger(str(SMOKE), None, None)  # the default home
    monkeypatch.delenv(HOME_ROOT_ENV)  # unset: only the default home
    monkeypatch.setenv("DDLBENCH_HOME", str(root / "default"))
    check_trigger(str(SMOKE), str(root / "default"), None)
    refused(lambda: check_trigger(str(SMOKE), str(root / "homes" / "x"), None), "home: ")


DEPLOYMENT_ONLY = [
    ({"provider.options.partition": "debug\necho PWNED > /tmp/pwned"}, "overrides.provider.options.partition"),
    ({"provider": {"name": "slurm", "options": {"account": "acct"}}}, "overrides.provider.options.account"),
    ({"provider.options": {"image": "evil:latest"}}, "overrides.provider.options.image"),
    ({"provider.options.service_account": "cluster-admin"}, "overrides.provider.options.service_account"),
    ({"provider.options.namespace": "kube-system"}, "overrides.provider.options.namespace"),
    ({"provider.options.slurm_conf": "/etc/slurm/other.conf"}, "overrides.provider.options.slurm_conf"),
    ({"provider.options.python": "/tmp/evil"}, "overrides.provider.options.python"),
    ({"train.data_root": "/etc"}, "overrides.train.data_root"),
    ({"train": {"download": True}}, "overrides.train.download"),
    ({"workloads": [{"model": "lenet5", "dataset": "mnist", "data_root": "/root"}]}, "overrides.workloads.0.data_root"),
    ({"algorithms": [{"name": "ssgd", "options": {"data_root": "/"}}]}, "overrides.algorithms.0.options.data_root"),
    ({"tracking": {"uri": "postgresql://u:p@db/x"}}, "overrides.tracking.uri"),
    ({"version": 1}, "overrides.version"),
]


@pytest.mark.parametrize(("overrides", "field"), DEPLOYMENT_ONLY, ids=[f for _, f in DEPLOYMENT_ONLY])
def test_deployment_only_overrides_are_refused_naming_the_field(overrides: dict, field: str) -> None:
    refused(lambda: check_trigger_overrides(overrides), f"{field}: ")


def test_every_deployment_only_field_is_named_one_line_each() -> None:
    with pytest.raises(SpecError) as err:
        check_trigger_overrides({"provider.options.partition": "debug\necho PWNED > /tmp/pwned",
                                 "provider.options.account": "acct\ntouch /tmp/x", "repeats": 1})
    assert str(err.value).splitlines() == [
        "overrides.provider.options.account: only the deployment sets it (a trigger chooses workloads, "
        "algorithms, sizes, links and repeats)",
        "overrides.provider.options.partition: only the deployment sets it (a trigger chooses workloads, "
        "algorithms, sizes, links and repeats)",
    ]


def test_what_a_trigger_chooses_passes() -> None:
    check_trigger_overrides({
        "repeats": 1, "regression.min_effect": 0.2, "train.inject_delay_ms": 20, "workers": [2, 4],
        "batch_sizes": [16], "steps": 10, "epochs": None, "train_timeout_s": 600, "network.link_bandwidth": "1gbit",
        "workloads": [{"model": "mlp", "dataset": "digits"}], "what_if.workers": [8],
        "algorithms": [{"name": "ssgd", "comm": "allreduce", "options": {"inject_delay_ms": 5}}],
        "microbench.sizes": [4096], "profile.repeats": 2, "tracking.system_metrics": False,
        "provider.name": "netns", "provider.options": {"nodes": 2, "bandwidth": "1gbit"},
    })
    # the onboarding form's overrides (dags/ddlbench_hardware_onboarding.py onboarding_overrides)
    check_trigger_overrides({
        "name": "onboarding-box-a", "suite": "onboarding", "hardware": "box-a",
        "provider": {"name": "netns", "options": {"nodes": 2, "devices_per_node": 1, "bandwidth": "1gbit"}},
        "workloads": [{"model": "lenet5", "dataset": "synthetic"}], "algorithms": [{"name": "odsgd", "comm": "ps"}],
        "workers": [2], "repeats": 1, "network": {"link_bandwidth": "1gbit"}, "what_if": {"workers": [1, 4, 8]},
    })


@pytest.mark.parametrize("provider", ["local", "netns", "slurm", "kubernetes"])
def test_the_onboarding_forms_overrides_pass_for_every_provider(provider: str) -> None:
    """What pipelines/onboarding.py builds from a valid form is what a trigger may choose (the
    local provider's options are an empty mapping, which sets nothing)."""
    from pipelines.onboarding import overrides

    form = {"hardware_label": "box-a", "provider": provider, "nodes": 1, "devices_per_node": 2,
            "bandwidth_gbps": 10, "models": ["lenet5"], "dataset": "digits", "algorithms": ["odsgd"],
            "world_sizes": [2], "base_spec": "specs/smoke.yaml"}
    check_trigger_overrides(overrides(form))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(provider=st.sampled_from(["local", "netns", "slurm", "kubernetes"]), data=st.data())
def test_every_provider_option_but_sizes_and_links_is_the_deployments(provider: str, data: Any) -> None:
    option = data.draw(st.sampled_from(sorted(provider_options_model(provider).model_fields)))
    nested = data.draw(st.booleans())
    overrides = ({"provider": {"options": {option: "x"}}} if nested else {f"provider.options.{option}": "x"})
    if option in TRIGGER_OPTIONS:
        check_trigger_overrides(overrides)
    else:
        refused(lambda: check_trigger_overrides(overrides), f"overrides.provider.options.{option}: only the deployment")


def test_every_allowed_pattern_is_a_spec_field() -> None:
    """The list of what a trigger may set names real fields (no typo lets a section through)."""
    from pipelines.spec import BenchSpec

    for pattern in TRIGGER_FIELDS:
        top = pattern.split(".")[0]
        assert top in BenchSpec.model_fields, pattern


def test_a_refused_trigger_ends_at_start_with_nothing_written(root: Path) -> None:
    home = root / "homes" / "nightly"
    cases = [
        ("/etc/shadow", str(home), None, "spec_path: "),
        (str(SMOKE), str(root / "outside"), None, "home: "),
        (str(SMOKE), str(home), {"provider.options.partition": "debug\necho PWNED > /tmp/pwned"},
         "overrides.provider.options.partition"),
        # the provider is the spec's: a local spec does not become a SLURM or Kubernetes run
        (str(SMOKE), str(home), {"provider.name": "slurm"}, "overrides.provider.name: 'slurm' is not the spec's"),
        (str(SMOKE), str(home), {"provider": {"name": "kubernetes", "options": {"nodes": 2}}},
         "overrides.provider.name: 'kubernetes' is not the spec's"),
    ]
    for spec_path, h, overrides, expected in cases:
        text = refused(lambda s=spec_path, h=h, o=overrides: steps.call("start", s, run_key="k", home=h, overrides=o,
                                                                          airflow=AIRFLOW), expected)
        assert "root:" not in text
    assert not home.exists() and not (root / "outside").exists()  # no run directory, no MLflow store


def test_paths_are_checked_as_start_uses_them(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`~` is not expanded in a spec path (start reads it as it is), so ~/specs/... is refused even
    where it would expand into the spec directories; an empty home is the default home, as start
    uses it."""
    from pipelines.spec.trigger import home_dir
    from pipelines.stages.lifecycle import plan

    monkeypatch.setenv("HOME", str(REPO))
    refused(lambda: check_trigger("~/specs/smoke.yaml", None, None), "spec_path: '~/specs/smoke.yaml' is outside")
    monkeypatch.setenv("DDLBENCH_HOME", str(root / "default"))
    check_trigger(str(SMOKE), "", None)
    assert home_dir("") is None
    assert plan(str(SMOKE), home="", airflow=AIRFLOW)[2] == (root / "default").resolve()


def test_the_allowed_fields_are_the_docs_table() -> None:
    """docs/security.md lists what a trigger may set: the same list as the code's."""
    doc = (REPO / "docs" / "security.md").read_text()
    listed = doc.split("<!-- trigger-fields -->")[1].split("<!-- /trigger-fields -->")[0]
    assert sorted(re.findall(r"`([^`]+)`", listed)) == sorted(TRIGGER_FIELDS)


def test_the_cli_owner_still_reads_any_path(root: Path) -> None:
    """Without Airflow the machine's owner chooses: any path, any field (still validated)."""
    elsewhere = root / "mine.yaml"
    elsewhere.write_text(SMOKE.read_text())
    assert load_spec(elsewhere, {"provider.options.threads_per_process": 1}).name == "smoke"
