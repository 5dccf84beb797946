"""Provider options never reach a shell as code (issue 38): every string option of every
provider is refused with one line naming it, or lands in the batch script / pod command as
exactly one quoted word, with the script's commands unchanged.

The commands of a script are read by bash itself: the script becomes the body of a function
that a restricted bash (no PATH, no redirections, no exec) defines and prints back with
`declare -f`, its canonical form, one command per line, comments (#SBATCH) dropped. A value
that adds a line, a command or a word changes that form.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra import ProviderError, get_provider
from infra.base import Job
from infra.kubernetes import KubernetesProvider
from infra.slurm import SlurmProvider

# Printable text, shell metacharacters and line breaks, as a careless or hostile trigger types them.
HOSTILE = st.one_of(
    st.text(max_size=40),
    st.lists(
        st.sampled_from(["debug", "\n", "\r", ";", "&&", "|", "$(id)", "`id`", "'", '"', "\\", "#", " ",
                         "echo PWNED > /tmp/pwned", "touch /tmp/x", "}", "{", "*", "~", "\t", "\x00", "$HOME"]),
        max_size=6,
    ).map("".join),
)
BASH = shutil.which("bash") or "/bin/bash"
FUZZ = settings(max_examples=60, deadline=None, derandomize=True)


def canonical(script: str) -> str:
    """bash's own reading of `script`: its commands, one per line, without comments (each
    word as written, so a value's quoted form is found in it as the script has it)."""
    proc = subprocess.run(
        [BASH, "--norc", "--noprofile", "-r", "-c",
         'IFS= read -r -d "" body; eval "ddlbench_script() {\n$body\n}" && declare -f ddlbench_script'],
        input=script, capture_output=True, text=True, env={"PATH": "/nonexistent"}, timeout=10,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def bash_n(script: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=10)
    assert proc.returncode == 0, proc.stderr


def sbatch_directives(script: str) -> list[str]:
    """The #SBATCH lines sbatch reads: those before the first command (it stops there)."""
    out = []
    for line in script.splitlines()[1:]:
        if not line.startswith("#"):
            break
        if line.startswith("#SBATCH "):
            out.append(line.removeprefix("#SBATCH "))
    return out


def one_line_naming(err: ProviderError, field: str) -> None:
    assert "\n" not in str(err) and f"provider.options.{field}" in str(err), str(err)


JOB = Job("training.run", ["run", "/runs/a b"], world_size=4, servers=1, log_path=Path("/runs/x/launcher.log"))

# Every string option of the slurm provider, with a valid value as the baseline.
SLURM_STRINGS = {
    "partition": "debug",
    "account": "acct",
    "time_limit": "30",
    "python": "/opt/py/bin/python3",
    "network_interface": "eth0",
    "shared_dir": "/shared",
    "slurm_conf": None,  # a path that must exist: the test's own file
}


def _slurm(option: str, value: object, conf: Path) -> SlurmProvider:
    return SlurmProvider(nodes=2, **{"slurm_conf": str(conf), option: value})


@pytest.mark.parametrize("option", sorted(SLURM_STRINGS))
@FUZZ
@given(value=HOSTILE)
def test_every_slurm_string_option_is_refused_or_one_quoted_word(option, value, tmp_path_factory):
    conf = tmp_path_factory.getbasetemp() / "slurm.conf"
    conf.touch()
    baseline = _slurm(option, SLURM_STRINGS[option] or str(conf), conf)
    try:
        provider = _slurm(option, value, conf)
    except ProviderError as err:
        one_line_naming(err, option)
        return
    script, expected = provider.batch_script(JOB), baseline.batch_script(JOB)
    bash_n(script)
    directives, base_directives = sbatch_directives(script), sbatch_directives(expected)
    assert [d.split("=")[0] for d in directives] == [d.split("=")[0] for d in base_directives]
    assert len(script.splitlines()) == len(expected.splitlines())
    if option in ("partition", "account", "time_limit"):
        assert f"--{option.replace('_limit', '')}={value}" in directives
    old, new = shlex.quote(str(SLURM_STRINGS[option] or conf)), shlex.quote(str(value))
    if option != "slurm_conf":  # the test's own path may hold the baseline ("30" in pytest-302)
        script, expected = (text.replace(str(conf), "/conf/slurm.conf") for text in (script, expected))
    assert canonical(script) == canonical(expected).replace(old, new)


def test_a_slurm_conf_whose_name_holds_a_line_break_is_refused_and_others_are_quoted(tmp_path):
    hostile = tmp_path / "slurm\necho PWNED.conf"
    hostile.touch()
    with pytest.raises(ProviderError) as err:
        SlurmProvider(slurm_conf=str(hostile))
    one_line_naming(err.value, "slurm_conf")
    odd = tmp_path / "a b $(id) `id`;.conf"
    odd.touch()
    script = SlurmProvider(slurm_conf=str(odd)).batch_script(JOB)
    bash_n(script)
    assert f"export SLURM_CONF={shlex.quote(str(odd))}" in script.splitlines()


def test_the_issues_injection_is_refused_naming_each_field():
    for options, field in [({"partition": "debug\necho PWNED > /tmp/pwned"}, "partition"),
                           ({"account": "acct\ntouch /tmp/x"}, "account")]:
        with pytest.raises(ProviderError) as err:
            SlurmProvider(**options)
        one_line_naming(err.value, field)
    with pytest.raises(ProviderError) as err:
        SlurmProvider(partition="debug\necho PWNED > /tmp/pwned", account="acct\ntouch /tmp/x")
    assert "provider.options.partition" in str(err.value) and "provider.options.account" in str(err.value)
    assert "PWNED" not in canonical(SlurmProvider(partition="debug", account="acct").batch_script(JOB))


@FUZZ
@given(home=HOSTILE)
def test_a_home_that_reaches_the_output_directive_adds_no_line(home):
    """The job log's path (under the run home, a trigger's choice) is the one value of a
    directive that no option validates: it is refused or quoted as one word."""
    job = Job("training.run", [], 2, log_path=Path("/runs") / home.replace("\x00", "") / "launcher.log")
    provider = SlurmProvider(partition="debug")
    try:
        script = provider.batch_script(job)
    except ProviderError as err:
        assert "\n" not in str(err) and "job log path" in str(err)
        return
    bash_n(script)
    expected = provider.batch_script(Job("training.run", [], 2, log_path=Path("/runs/x/launcher.log")))
    assert len(sbatch_directives(script)) == len(sbatch_directives(expected))
    assert canonical(script) == canonical(expected)
    output = next(d for d in sbatch_directives(script) if d.startswith("--output="))
    assert shlex.split(output) == [f"--output={job.log_path.resolve()}"]


# Every string option of the kubernetes provider: the pod command (bash -c) and API objects.
K8S_STRINGS = {
    "image": "registry:5000/ddlbench:1.0",
    "namespace": "bench",
    "cpu": "500m",
    "memory": "32Gi",
    "volume_claim": "runs",
    "mount_path": "/runs",
    "service_account": "ddlbench",
    "python": "/opt/py/bin/python3",
    "name_prefix": "ddlbench",
    "kubeconfig": "/etc/kube/config",
    "context": "lab",
    "api_server": "https://10.0.0.1:6443",
}
K8S_JOB = Job("training.run", ["run", "/runs/a b"], world_size=3, servers=1, log_path=Path("/runs/x/log"))


@pytest.mark.parametrize("option", sorted(K8S_STRINGS))
@FUZZ
@given(value=HOSTILE)
def test_every_kubernetes_string_option_is_refused_or_passed_as_is(option, value):
    extra = {"mount_path": "/runs"} if option == "volume_claim" else {}
    base_opts = {"nodes": 2, option: K8S_STRINGS[option], **extra}
    try:
        provider = KubernetesProvider(**{**base_opts, option: value})
    except ProviderError as err:
        one_line_naming(err, option)
        return
    assert not re.search(r"[\x00-\x1f\x7f]", value), f"{option} accepted a control character"
    _, job = provider.objects(K8S_JOB, "probe")
    _, base_job = KubernetesProvider(**base_opts).objects(K8S_JOB, "probe")
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    base_command = base_job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["bash", "-c"]
    bash_n(command[2])
    expected = canonical(base_command[2])
    if option == "python":  # the one option the pod command carries
        expected = expected.replace(shlex.quote(K8S_STRINGS[option]), shlex.quote(value))
    assert canonical(command[2]) == expected


@FUZZ
@given(key=HOSTILE, value=HOSTILE)
def test_node_selector_labels_follow_kubernetes_syntax(key, value):
    try:
        provider = KubernetesProvider(node_selector={key: value})
    except ProviderError as err:
        one_line_naming(err, "node_selector")
        return
    assert re.fullmatch(r"[A-Za-z0-9./_-]+", key) and re.fullmatch(r"[A-Za-z0-9._-]*", value)
    assert provider.node_selector == {key: value}


@pytest.mark.parametrize("option", ["bandwidth", "subnet"])
@FUZZ
@given(value=HOSTILE)
def test_netns_string_options_are_refused_or_plain_words(option, value):
    """netns runs `ip` and `tc` with argument lists (no shell) and names its namespaces and
    interfaces itself; its two string options are still refused unless they are plain words."""
    try:
        provider = get_provider("netns", nodes=2, **{option: value})
    except ProviderError as err:
        one_line_naming(err, option)
        return
    assert re.fullmatch(r"[A-Za-z0-9./]+", value)
    for i in range(2):
        assert re.fullmatch(r"[a-z0-9-]{1,40}", provider.ns_name(i)) and len(provider.ifname(i)) <= 15
