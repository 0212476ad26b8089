"""The deployment files in clusters/ and docker/, checked statically.

No Docker engine, cloud account or Kubernetes cluster is available where gtep is developed, so these files
are not run here, but for the SLURM script, which tests/cluster/test_slurm.py submits to a one-machine SLURM
cluster. These tests catch what can be caught without running them: YAML that does not parse or
lacks what its kind needs, gtep commands and options that do not exist, images without a Dockerfile,
Dockerfiles that copy missing files, a Ray version that differs from the development venv's, and a SLURM
script whose ports could collide.
"""
from __future__ import annotations

import functools
import json
import re
import subprocess
import tomllib
from importlib.metadata import distribution, version
from pathlib import Path

import jsonschema
import pytest
import typer
import yaml

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(p for folder in ("clusters", "docker") for p in (ROOT / folder).rglob("*") if p.is_file())
YAMLS = [p for p in FILES if p.suffix in (".yaml", ".yml")]
DOCKERFILES = sorted((ROOT / "docker").glob("Dockerfile.*"))
SBATCH = ROOT / "clusters" / "slurm" / "gtep.sbatch"
RAY_VERSION = version("ray")  # ray.__version__ without importing ray


def ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def documents(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def logical_lines(text: str) -> list[str]:
    """Lines with backslash continuations joined; a continued comment line continues in the next comment."""
    lines, current = [], ""
    for line in text.splitlines():
        if current:
            line = re.sub(r"^\s*#?\s*", " ", line)
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1]
            continue
        lines.append(current + line)
        current = ""
    return lines + ([current] if current else [])


def walk(node):
    """Every dict inside a YAML document."""
    if isinstance(node, dict):
        yield node
        node = list(node.values())
    if isinstance(node, list):
        for item in node:
            yield from walk(item)


# ------------------------------------------------------------------ the gtep command line


@functools.cache
def cli() -> dict[str, set[str]]:
    """Each subcommand ('run', and 'jobs status' for a nested group) -> its options, from the real app.
    Typer builds these on its own copy of click, so parameters and groups are recognised by duck typing."""
    from gtep.cli import app

    commands: dict[str, set[str]] = {}

    def visit(group, prefix: str) -> None:
        for name, command in group.commands.items():
            commands[prefix + name] = {"--help"} | {opt for param in command.params if param.param_type_name == "option"
                                                    for opt in (*param.opts, *param.secondary_opts)}
            if hasattr(command, "commands"):
                visit(command, f"{prefix}{name} ")

    visit(typer.main.get_command(app), "")
    return commands


# `gtep` then a word, not part of a path or a name (/opt/gtep, gtep-mlflow, gtep:cpu). The command line ends
# at a backtick, a shell operator (; | &), a single quote closing a shell string, or an inline comment.
GTEP_COMMAND = re.compile(r"(?<![\w./-])gtep[ \t]+([a-z][\w-]*)(?:[ \t]+([a-z][\w-]*))?([^`;|&'\n]*?)(?=\s#|$|[`;|&'])",
                          re.M)


def gtep_commands(path: Path) -> list[str]:
    """Every gtep command line in a file: written out, or given as arguments to a gtep image's entrypoint."""
    lines = [m.group(0) for line in logical_lines(path.read_text()) for m in GTEP_COMMAND.finditer(line)]
    if path.suffix not in (".yaml", ".yml"):
        return lines
    for doc in documents(path):
        if "services" in doc:  # compose: `command` is the arguments of the image's entrypoint (gtep)
            argv = [s.get("command") for s in doc["services"].values()
                    if is_gtep_image(s.get("image", "")) and "entrypoint" not in s]
        else:  # Kubernetes: `command` replaces the entrypoint, `args` are its arguments
            argv = [n.get("args") for n in walk(doc) if isinstance(n.get("image"), str) and is_gtep_image(n["image"])
                    and "command" not in n]
        lines += ["gtep " + (a if isinstance(a, str) else " ".join(map(str, a))) for a in argv if a]
    return lines


def command_problems(line: str) -> list[str]:
    match = GTEP_COMMAND.search(line)
    name, nested, rest = match.groups()
    commands = cli()
    if name not in commands:
        return [f"{line.strip()!r}: gtep has no command {name!r} (if this is prose, not a command, reword it)"]
    if nested and f"{name} {nested}" in commands:
        name = f"{name} {nested}"
    elif any(c.startswith(name + " ") for c in commands):
        return [f"{line.strip()!r}: 'gtep {name} {nested}' is not a command of the {name} group"]
    unknown = sorted(set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest)) - commands[name])
    return [f"{line.strip()!r}: gtep {name} has no option {opt}" for opt in unknown]


@pytest.mark.parametrize("path", FILES, ids=ids(FILES))
def test_gtep_commands_and_options_exist(path):
    problems = [p for line in gtep_commands(path) for p in command_problems(line)]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ images and Dockerfiles


def is_gtep_image(image: str) -> bool:
    return image.rsplit("/", 1)[-1].split(":")[0] == "gtep"


# The tag names the Dockerfile: gtep:cpu, or <registry>/gtep:cpu, is built from docker/Dockerfile.cpu.
def dockerfile_of(image: str) -> Path:
    return ROOT / "docker" / f"Dockerfile.{image.rsplit('/', 1)[-1].partition(':')[2]}"


@pytest.mark.parametrize("path", YAMLS, ids=ids(YAMLS))
def test_gtep_images_map_to_a_dockerfile(path):
    nodes = [n for doc in documents(path) for n in walk(doc)]
    images = [v for n in nodes for k, v in n.items()
              if k in ("image", "head_image", "worker_image") and isinstance(v, str)]
    for image in filter(is_gtep_image, images):
        assert dockerfile_of(image).exists(), f"{image}: no {dockerfile_of(image).relative_to(ROOT)}"
    for node in nodes:  # a compose build section builds the Dockerfile its image's tag names
        if isinstance(node.get("build"), dict) and is_gtep_image(node.get("image", "")):
            built = (path.parent / node["build"]["context"] / node["build"]["dockerfile"]).resolve()
            assert built == dockerfile_of(node["image"]), f"{node['image']} is built from {built}"


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    lines = [line.strip() for line in logical_lines(path.read_text())
             if line.strip() and not line.lstrip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


@pytest.mark.parametrize("path", DOCKERFILES, ids=ids(DOCKERFILES))
def test_dockerfile(path):
    steps = dockerfile_instructions(path)
    # The build context is the repository root (docker build -f docker/Dockerfile.x .).
    copies = [[a for a in args.split() if not a.startswith("--")] for op, args in steps if op == "COPY"]
    for *sources, dest in copies:
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: not in the repository"
    assert [json.loads(args) for op, args in steps if op == "ENTRYPOINT"] == [["gtep"]]
    # The installed package holds its search spaces (package data): nothing copied beside it, nothing pointing there.
    env = " ".join(args for op, args in steps if op == "ENV")
    assert "GTEP_SEARCH_SPACES" not in env
    assert not [source for *sources, _ in copies for source in sources if "search_spaces" in source]
    # One Ray for the image, KubeRay's rayVersion and this venv: a cluster needs the same Ray everywhere.
    assert re.search(r"\bRAY_VERSION=(\S+)", " ".join(a for op, a in steps if op == "ARG")).group(1) == RAY_VERSION
    run_steps = " ".join(a for op, a in steps if op == "RUN")
    assert "download.pytorch.org/whl/" in run_steps, "torch not from PyTorch's index"


@pytest.mark.parametrize("path", DOCKERFILES, ids=ids(DOCKERFILES))
def test_dockerfile_installs_extras_pyproject_declares(path):
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    runs = " ".join(args for op, args in dockerfile_instructions(path) if op == "RUN")
    installs = re.findall(r"pip install[^&]*?/opt/gtep\[([\w,-]+)\]", runs)
    assert installs, "the project is not pip-installed from /opt/gtep with an extra"
    for extra in ",".join(installs).split(","):
        assert extra in declared, f"gtep[{extra}]: pyproject.toml declares only {sorted(declared)}"


# ------------------------------------------------------------------ the YAML files, by kind


@pytest.mark.parametrize("path", YAMLS, ids=ids(YAMLS))
def test_yaml_has_what_its_kind_needs(path):
    docs = documents(path)
    assert docs, "empty"
    for doc in docs:
        if "cluster_name" in doc:
            check_ray_up(doc)
        elif "services" in doc:
            check_compose(doc)
        else:
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), "not a Kubernetes object"
            if doc["kind"] == "RayCluster":
                check_ray_cluster(doc["spec"], doc["apiVersion"])
            elif doc["kind"] == "RayJob":
                assert doc["spec"]["entrypoint"].startswith("gtep "), doc["spec"]["entrypoint"]
                assert doc["spec"]["shutdownAfterJobFinishes"] is True
                assert doc["spec"]["submissionMode"] == "K8sJobMode"
                assert "env_vars" in yaml.safe_load(doc["spec"]["runtimeEnvYAML"])
                check_ray_cluster(doc["spec"]["rayClusterSpec"], doc["apiVersion"])


def check_ray_up(doc):
    """A ray up config: the keys gtep's flow relies on, then Ray's own schema (shipped with the installed Ray)."""
    assert doc["provider"]["type"] in ("aws", "gcp")
    assert doc["head_node_type"] in doc["available_node_types"]
    head = doc["available_node_types"][doc["head_node_type"]]
    assert head["resources"] == {"CPU": 0}, "trials would land on the head"
    # The dashboard accepts jobs: it stays on the head's loopback, reached through `ray dashboard`'s ssh tunnel.
    assert any("--dashboard-host=127.0.0.1" in c for c in doc["head_start_ray_commands"])
    # The launcher starts containers as `docker run ... IMAGE bash`, which gtep's ENTRYPOINT would swallow.
    assert '--entrypoint=""' in doc["docker"]["run_options"]
    schema = json.loads(Path(distribution("ray").locate_file("ray/autoscaler/ray-schema.json")).read_text())
    jsonschema.validate(doc, schema)


def check_compose(doc):
    assert {"postgres", "mlflow", "ray-head", "ray-worker"} <= doc["services"].keys()
    assert doc["services"]["mlflow"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert "healthcheck" in doc["services"]["postgres"]
    for name, service in doc["services"].items():
        for port in service.get("ports", []):  # the host side binds loopback only: Ray's job server runs code
            assert str(port).startswith("127.0.0.1:"), f"{name}: {port} is published on every interface"


def check_ray_cluster(spec, api_version):
    assert api_version == "ray.io/v1"
    assert spec["rayVersion"] == RAY_VERSION, "rayVersion must be the Ray inside the images"
    head = spec["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {p["containerPort"] for p in head["ports"]} >= {6379, 8265, 10001}
    assert spec["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "0.0.0.0"
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits.get("nvidia.com/gpu", 0)) >= 1, f"{group['groupName']}: no GPU"


def test_kuberay_mlflow_stack():
    docs = [doc for path in (ROOT / "clusters" / "kuberay").glob("*.yaml") for doc in documents(path)]
    named = {(d["kind"], d["metadata"]["name"]) for d in docs}
    images = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]
              for d in docs if d["kind"] == "Deployment"}
    assert images["gtep-postgres"]["image"].startswith("postgres:")
    mlflow = images["gtep-mlflow"]
    assert is_gtep_image(mlflow["image"]) and mlflow["args"][0] == "server"
    assert mlflow["readinessProbe"]["httpGet"]["path"] == "/health"
    assert {("Service", "gtep-postgres"), ("Service", "gtep-mlflow"), ("Secret", "gtep-postgres")} <= named
    # Every volume claim and secret the objects refer to is defined in clusters/kuberay/.
    nodes = [n for d in docs for n in walk(d)]
    for claim in {n["claimName"] for n in nodes if "claimName" in n}:
        assert ("PersistentVolumeClaim", claim) in named, claim
    for ref in (n["secretKeyRef"] for n in nodes if "secretKeyRef" in n):
        assert ("Secret", ref["name"]) in named, ref
    # The drivers' tracking URI names a Service on its port.
    ports = {(d["metadata"]["name"], p["port"]) for d in docs if d["kind"] == "Service" for p in d["spec"]["ports"]}
    text = " ".join(p.read_text() for p in (ROOT / "clusters" / "kuberay").glob("*.yaml"))
    for host, port in set(re.findall(r"https?://(gtep-[\w-]+):(\d+)", text)):
        assert (host, int(port)) in ports, f"http://{host}:{port}: no such Service"


# ------------------------------------------------------------------ the SLURM script


def sbatch_code() -> str:
    return "\n".join(line for line in logical_lines(SBATCH.read_text()) if not line.lstrip().startswith("#"))


def test_sbatch_parses():
    subprocess.run(["bash", "-n", str(SBATCH)], check=True)


def ports_of_job(job_id: int) -> dict[str, int]:
    """Run the script's ports block for one job id and return its *PORT variables."""
    block = re.search(r"# --- ports: begin.*?\n(.*?)# --- ports: end", SBATCH.read_text(), re.S).group(1)
    script = f"SLURM_JOB_ID={job_id}\n{block}\nfor v in $(compgen -v | grep 'PORT$'); do echo \"$v=${{!v}}\"; done"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    return {name: int(value) for name, value in (line.split("=") for line in out.split())}


def port_set(ports: dict[str, int]) -> set[int]:
    """The single ports plus every port of the worker range."""
    single = {v for k, v in ports.items() if k not in ("MIN_WORKER_PORT", "MAX_WORKER_PORT")}
    return single | set(range(ports["MIN_WORKER_PORT"], ports["MAX_WORKER_PORT"] + 1))


def test_sbatch_ports_are_distinct_within_a_job_and_between_jobs():
    jobs = {job: ports_of_job(job) for job in (1000, 1001, 1250, 1499, 987654)}
    for job, ports in jobs.items():
        single = [v for k, v in ports.items() if k not in ("MIN_WORKER_PORT", "MAX_WORKER_PORT")]
        assert len(set(single)) == len(single), f"job {job}: two Ray ports are equal: {ports}"
        assert not set(single) & set(range(ports["MIN_WORKER_PORT"], ports["MAX_WORKER_PORT"] + 1))
        # Below the Linux ephemeral range, which outgoing connections draw from.
        assert 1024 <= min(port_set(ports)) and max(port_set(ports)) < 32768, f"job {job}: {ports}"
    for a in jobs:
        for b in jobs:
            if a < b:
                assert not port_set(jobs[a]) & port_set(jobs[b]), f"jobs {a} and {b} share ports"


def test_sbatch_starts_ray_with_every_port_and_a_per_job_temp_dir():
    code = sbatch_code()
    starts = [line for line in code.splitlines() if "ray start" in line]
    heads = [line for line in starts if "--head" in line]
    assert len(heads) == 1, "the head is started once"
    per_node = {"--node-manager-port", "--object-manager-port", "--min-worker-port", "--max-worker-port",
                "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--metrics-export-port",
                "--runtime-env-agent-port", "--temp-dir"}
    for line in starts:
        flags = set(re.findall(r"(--[a-z-]+)=", line))
        assert per_node <= flags, f"missing {per_node - flags} in: {line}"
        assert '--temp-dir="$RAY_TMP"' in line
    assert {"--port", "--ray-client-server-port", "--dashboard-port"} <= set(re.findall(r"(--[a-z-]+)=", heads[0]))
    # Every port variable of the ports block is given to Ray somewhere.
    for name in ports_of_job(1):
        assert f'"${name}"' in code, f"{name} is computed but not used"
    assert re.search(r"^RAY_TMP=\S*\$\{?SLURM_JOB_ID\}?", code, re.M), "the temp dir is not per job"


def test_sbatch_starts_workers_in_a_loop_and_waits_for_all_nodes_before_the_driver():
    code = sbatch_code()
    worker = code.index("ray start --address")
    loop = code.rfind("\nfor ", 0, worker)
    assert loop != -1 and "done" not in code[loop:worker], "the workers are not started in a for loop"
    assert re.search(r"^\s*(until|while)\b", code, re.M) and re.search(r"\bexit [1-9]", code), \
        "no wait loop that fails the job on a timeout"
    wait_all = code.index("$SLURM_JOB_NUM_NODES")
    assert worker < wait_all < code.index("gtep run"), "the driver must start after every node has joined"


def test_sbatch_asks_for_gpus_per_machine_and_gives_ray_what_slurm_allocated():
    """GPUs the SLURM way (--gpus-per-node or --gres=gpu:N, per machine), and every Ray node gets the count SLURM
    gave its machine, not a number of its own. tests/cluster/test_slurm.py runs the script on real SLURM."""
    text = SBATCH.read_text()
    assert re.search(r"^#SBATCH --(gpus-per-node=\d+|gres=gpu:\d+)$", text, re.M)
    assert "--gpus-per-task" not in text
    code = sbatch_code()
    assert re.search(r'^gpus=\$\{SLURM_GPUS_ON_NODE:-0\}$', code, re.M)
    starts = [line for line in code.splitlines() if "ray start" in line]
    assert starts and all('--num-gpus="$gpus"' in line for line in starts)


CLUSTER_DOCS = (ROOT / "clusters" / "README.md", ROOT / "docs" / "cluster.md")
NOT_RUN = re.compile(r"never (?:been )?run|not been run|no (?:\w+ )*SLURM (?:installation|cluster)|SLURM "
                     r"installation was (?:not )?available", re.I)


def sentences(text: str) -> list[str]:
    return re.split(r"(?<=[.;])\s+", " ".join(text.split()))


@pytest.mark.parametrize("doc", CLUSTER_DOCS, ids=ids(CLUSTER_DOCS))
def test_cluster_documents_say_the_slurm_script_is_run(doc):
    """tests/cluster/test_slurm.py submits the SLURM script to a real (one-machine) SLURM cluster: neither document
    may say that no SLURM was available or that the script was never run, and both name that test."""
    assert (ROOT / "tests" / "cluster" / "test_slurm.py").exists()
    text = doc.read_text()
    assert "tests/cluster/test_slurm.py" in text, f"{doc.relative_to(ROOT)} does not say where the script is run"
    wrong = [s for s in sentences(text) if NOT_RUN.search(s) and ("SLURM" in s or "these files" in s)
             and not re.search(r"SLURM script (?:is run|has)", s)]
    assert not wrong, f"{doc.relative_to(ROOT)} says the SLURM script was not run: {wrong}"


def test_sbatch_exclusive_is_explained_where_the_options_are_listed():
    """--exclusive costs a user whole machines: the script says why, next to the option, and how to drop it; so does
    docs/cluster.md's SLURM section."""
    lines = SBATCH.read_text().splitlines()
    at = lines.index("#SBATCH --exclusive")
    comment = " ".join(line.lstrip("# ") for line in lines[max(0, at - 8):at] if not line.startswith("#SBATCH"))
    assert "--exclusive" in comment and "memory" in comment, comment
    assert "delete this line" in comment and "sbatch" in comment, comment
    slurm = (ROOT / "docs" / "cluster.md").read_text().split("## SLURM", 1)[1].split("\n## ", 1)[0]
    said = " ".join(slurm.split())
    assert "`--exclusive`" in said and "`#SBATCH --exclusive`" in said, "docs/cluster.md's SLURM section does not " \
        "say why the script asks for whole machines or how to drop it"
