"""A tracking server a team shares (issue 50): `gtep server --auth` on 127.0.0.1, users and grants through
`gtep users`, studies run with a user's credentials; refusals before compute; no password in anything gtep wrote.

One server (sqlite) for the module, one tiny study run by its owner, the other tests read it. The PostgreSQL
test starts a server of its own on tests/with-postgres.sh's database (SHARED_SCOPES: the postgres group)."""
from __future__ import annotations

import os
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from typer.testing import CliRunner

from gtep.cli import app
from tests.cluster.support import ENV, MlflowServer
from tests.studies import CONFIG

pytestmark = pytest.mark.cluster

ADMIN = ("admin", "admin-Pa55word-0000")
ALICE = ("alice", "Tulip-Harbor-1111")  # the study's owner (gtep users refuses a password holding the name)
BOB = ("bob", "Granite-Violin-2222")    # a teammate: the server's default READ on alice's study
PASSWORDS = [ADMIN[1], ALICE[1], BOB[1], "wrong-Pa55word-3333"]
STUDY = "team"
SEARCH = {"trials": 2, "orderings": 1}


def environment(user: tuple[str, str] | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in ENV.items() if not k.startswith(("MLFLOW_TRACKING_", "MLFLOW_AUTH_"))}
    if user is not None:
        env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"] = user
    return {**env, **extra}


@contextmanager
def as_user(user: tuple[str, str]) -> Iterator[None]:
    """This process sends `user`'s credentials: MLflow's client reads the variables on every request."""
    with pytest.MonkeyPatch.context() as patch:  # put back as they were afterwards, set or not
        patch.setenv("MLFLOW_TRACKING_USERNAME", user[0])
        patch.setenv("MLFLOW_TRACKING_PASSWORD", user[1])
        yield


def gtep(user: tuple[str, str], *args: str, stdin: str | None = None) -> tuple[int, str]:
    """A gtep command as `user`, in this process (its Ray: conftest's local_ray); (exit code, what it printed)."""
    with as_user(user):
        result = CliRunner().invoke(app, list(args), input=stdin)
    return result.exit_code, result.output + (f"\n{result.exception!r}" if result.exit_code not in (0, 2) else "")


class AuthServer(MlflowServer):
    """`gtep server --auth` with the admin's password in its environment only."""

    def arguments(self) -> list[str]:
        return ["--auth", *super().arguments()]

    def environment(self) -> dict[str, str]:
        return environment(None, MLFLOW_AUTH_ADMIN_USERNAME=ADMIN[0], MLFLOW_AUTH_ADMIN_PASSWORD=ADMIN[1],
                           GTEP_AUTH_DATABASE_URI=f"sqlite:///{self.root / 'basic_auth.db'}")


def client_as(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def add_users(server: AuthServer) -> None:
    for user in (ALICE, BOB):  # through the command, the password on stdin
        code, output = gtep(ADMIN, "users", "add", user[0], "--tracking-uri", server.uri, "--password-stdin",
                            stdin=user[1] + "\n")
        assert code == 0, output


def run_study(server: AuthServer, root: Path, study: str = STUDY) -> tuple[int, str]:
    """alice's `gtep run` of the tiny study, on this worker's Ray."""
    config = root / f"{study}.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "study": study, "search": SEARCH}))
    return gtep(ALICE, "run", "--config", str(config), "--output", str(root / "out"), "--tracking-uri", server.uri)


@pytest.fixture(scope="module")
def team(tmp_path_factory, local_ray):
    """The server, its users, and alice's finished study."""
    root = tmp_path_factory.mktemp("auth")
    server = AuthServer(root).start()
    try:
        add_users(server)
        code, output = run_study(server, root)
        assert code == 0, output[-3000:]
        yield {"server": server, "root": root, "output": output}
    finally:
        server.stop()


def assert_both_phases(uri: str, study: str) -> None:
    with as_user(ALICE):
        client = client_as(uri)
        experiment = client.get_experiment_by_name(f"gtep/{study}")
        runs = client.search_runs([experiment.experiment_id], max_results=1000)
    phases = Counter(r.data.tags["gtep.phase"] for r in runs if r.data.tags.get("gtep.level") == "phase")
    assert phases == {"tune": 1, "evaluate": 1}
    assert all(r.info.status == "FINISHED" for r in runs)


def files_containing(folders: list[Path], secrets: list[str]) -> list[str]:
    """Every file under `folders` (binary ones too: sqlite stores, Ray's logs) that holds one of `secrets`."""
    found = []
    needles = [s.encode() for s in secrets]
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                found += [f"{path}: {s.decode()}" for s in needles if s in data]
    return found


def ray_session_logs() -> Path:
    """This worker's Ray session logs (conftest: RAY_TMPDIR of its own), where the study's trials ran."""
    sessions = sorted(Path(os.environ["RAY_TMPDIR"]).glob("**/session_*/logs"))
    assert sessions, f"no Ray session under {os.environ['RAY_TMPDIR']}"
    return sessions[-1].parent


def test_a_study_runs_both_phases_into_an_authenticated_server_and_no_password_is_written(team):
    assert_both_phases(team["server"].uri, STUDY)
    # the store and users database, the auth config, the study folder, the server's log, Ray's session logs
    everything = [team["root"], ray_session_logs()]
    assert files_containing(everything, PASSWORDS) == []
    assert not [secret for secret in PASSWORDS if secret in team["output"]]  # the terminal


def refused(output: str) -> str:
    """The one error line a refused command printed."""
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, output
    return errors[0]


def test_a_wrong_password_is_refused_before_compute_in_one_line(team, tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "study": "wrong", "search": SEARCH}))
    code, output = gtep((ALICE[0], PASSWORDS[3]), "run", "--config", str(config), "--output", str(tmp_path / "out"),
                        "--tracking-uri", team["server"].uri)
    assert code == 2, output
    assert "refused the credentials from MLFLOW_TRACKING_USERNAME" in refused(output)
    assert PASSWORDS[3] not in output
    assert not (tmp_path / "out" / "wrong").exists()  # nothing was made, nothing trained


def test_a_user_without_edit_on_the_study_is_refused_before_compute(team, tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "study": STUDY, "search": SEARCH}))
    code, output = gtep(BOB, "tune", "--config", str(config), "--output", str(tmp_path / "out"), "--tracking-uri",
                        team["server"].uri)
    assert code == 2, output
    line = refused(output)
    assert f"may not write study '{STUDY}'" in line and "EDIT" in line and BOB[1] not in output
    events = tmp_path / "out" / STUDY / "events.jsonl"
    assert not events.exists() or "unit_trained" not in events.read_text()


def test_a_read_user_can_report_but_not_log(team, tmp_path):
    code, output = gtep(BOB, "report", STUDY, "--tracking-uri", team["server"].uri, "--no-log", "--out",
                        str(tmp_path / "report"))
    assert code == 0, output
    assert any((tmp_path / "report").iterdir())
    with as_user(BOB):
        bob = client_as(team["server"].uri)
        experiment = bob.get_experiment_by_name(f"gtep/{STUDY}")
        with pytest.raises(Exception, match="403"):
            bob.create_run(experiment.experiment_id)


def test_a_user_cannot_delete_anothers_experiment_until_granted(team):
    from gtep.orchestration.tracking_auth import check_can_write

    uri = team["server"].uri
    with as_user(BOB):
        bob = client_as(uri)
        experiment_id = bob.get_experiment_by_name(f"gtep/{STUDY}").experiment_id
        with pytest.raises(Exception, match="403"):
            bob.delete_experiment(experiment_id)
        assert bob.get_experiment(experiment_id).lifecycle_stage == "active"
    # the owner grants EDIT through gtep users: bob may now write the study, and still not delete it
    code, output = gtep(ALICE, "users", "grant", BOB[0], STUDY, "EDIT", "--tracking-uri", uri)
    assert code == 0, output
    with as_user(BOB):
        check_can_write(uri, STUDY, experiment_id)
        with pytest.raises(Exception, match="403"):
            bob.delete_experiment(experiment_id)


def test_a_study_runs_both_phases_into_an_authenticated_postgresql_backed_server(tmp_path, local_ray):
    uri = os.environ.get("GTEP_TEST_POSTGRES_URI")
    if not uri:
        if os.environ.get("CI"):
            pytest.fail("GTEP_TEST_POSTGRES_URI is not set: run the tests through tests/with-postgres.sh")
        pytest.skip("no PostgreSQL: run through tests/with-postgres.sh")
    server = AuthServer(tmp_path, backend_store_uri=uri).start()
    try:
        add_users(server)
        code, output = run_study(server, tmp_path, "team-pg")
        assert code == 0, output[-3000:]
        assert_both_phases(server.uri, "team-pg")
        assert files_containing([tmp_path, ray_session_logs()], PASSWORDS) == []
    finally:
        server.stop()


# ---------------------------------------------------------------- issue 57, end to end on the real server

def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_servers_stores_are_their_owners_only(team):
    root = team["root"]
    assert mode(root / "server.db") == 0o600 and mode(root / "basic_auth.db") == 0o600  # runs; password hashes
    artifacts = root / "artifacts"
    assert mode(artifacts) == 0o700
    made = [p for p in artifacts.rglob("*")]
    assert made and all(mode(p) & 0o077 == 0 for p in made), [(p, oct(mode(p))) for p in made if mode(p) & 0o077]
    study_store = root / "out"  # alice's study folder (its store is the server's): nothing of the store in it
    assert not (study_store / "mlflow.db").exists()


@pytest.mark.parametrize("scheme", ["HTTP", "Http"])
def test_a_scheme_in_capitals_gets_the_same_checks(team, tmp_path, scheme):
    uri = team["server"].uri.replace("http", scheme, 1)
    # the credentials check runs (before: HTTP:// skipped it, and the permission check with it)
    code, output = gtep((ALICE[0], PASSWORDS[3]), "report", STUDY, "--tracking-uri", uri, "--no-log", "--out",
                        str(tmp_path / "r"))
    assert code == 2 and "refused the credentials from MLFLOW_TRACKING_USERNAME" in refused(output), output
    # a password in it is refused without repeating it, and nothing is asked of the server
    code, output = gtep(ALICE, "sync", str(team["root"] / "out" / STUDY), "--tracking-uri",
                        uri.replace("://", f"://alice:{ALICE[1]}@"))
    assert code == 2 and ALICE[1] not in output and "alice:***@" in output


def test_a_user_with_a_credentials_file_changes_their_own_password(team, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".mlflow").mkdir(parents=True)
    creds = home / ".mlflow" / "credentials"
    creds.write_text(f"[mlflow]\nmlflow_tracking_username = bob\nmlflow_tracking_password = {BOB[1]}\n")
    creds.chmod(0o600)
    monkeypatch.setenv("HOME", str(home))
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    new = "Copper-Lantern-5555"
    result = CliRunner().invoke(app, ["users", "password", "bob", "--tracking-uri", team["server"].uri,
                                      "--password-stdin"], input=new + "\n")
    assert result.exit_code == 0, result.output  # before: MLflow asked for the current password, found none
    code, output = gtep(("bob", new), "report", STUDY, "--tracking-uri", team["server"].uri, "--no-log", "--out",
                        str(tmp_path / "r"))
    assert code == 0, output
    code, output = gtep(("bob", new), "users", "password", "bob", "--tracking-uri", team["server"].uri,
                        "--password-stdin", stdin=BOB[1] + "\n")  # back, for the module's other tests
    assert code == 0, output


def test_a_read_users_ui_lists_studies_it_may_not_tag(team):
    from gtep.orchestration.tracking import prepare_ui

    uri = team["server"].uri
    with as_user(ALICE):  # a study without gtep's saved views (as one made before them)
        client_as(uri).create_experiment("gtep/untagged")
    with as_user(BOB):  # READ on it: may not write its tags
        found = dict(prepare_ui(uri))  # before: a 403 traceback
    assert "untagged" in found and STUDY in found


def test_gtep_users_refuse_a_weak_password_on_the_real_server(team):
    code, output = gtep(ADMIN, "users", "add", "carol", "--tracking-uri", team["server"].uri, "--password-stdin",
                        stdin="aaaaaaaaaaaa\n")
    assert code == 2 and "error: password" in output and "aaaaaaaaaaaa" not in output


def test_no_database_password_in_any_process_arguments(tmp_path):
    """The store address with a password from GTEP_BACKEND_STORE_URI: the server answers (MLflow got it from
    its environment) and no process of the machine has it in its arguments (gtep's, mlflow server's, its
    workers'). PostgreSQL's trust authentication takes any password, so the test's address gets one."""
    import subprocess

    uri = os.environ.get("GTEP_TEST_POSTGRES_URI")
    if not uri:
        if os.environ.get("CI"):
            pytest.fail("GTEP_TEST_POSTGRES_URI is not set: run the tests through tests/with-postgres.sh")
        pytest.skip("no PostgreSQL: run through tests/with-postgres.sh")
    secret = "Db-Secret-7913"
    user, rest = uri.split("://", 1)[1].split("@", 1)
    with_password = f"postgresql://{user.split(':')[0]}:{secret}@{rest}"

    class EnvironmentStore(AuthServer):
        def arguments(self) -> list[str]:
            args = super().arguments()
            at = args.index("--backend-store-uri")
            return args[:at] + args[at + 2:]

        def environment(self) -> dict[str, str]:
            return {**super().environment(), "GTEP_BACKEND_STORE_URI": with_password}

    server = EnvironmentStore(tmp_path, backend_store_uri=with_password).start()
    try:
        listing = subprocess.run(["ps", "-eo", "args="], capture_output=True, text=True).stdout
        assert secret not in listing
        table = [line.split() for line in subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True,
                                                         text=True).stdout.splitlines()]
        pids = [str(server.process.pid)]
        for _ in range(4):  # gtep server -> mlflow server (a session of its own) -> its workers
            pids += [pid for pid, ppid in table if ppid in pids and pid not in pids]
        assert len(pids) >= 3, pids
        environs = [Path(f"/proc/{pid}/environ").read_bytes() for pid in pids if Path(f"/proc/{pid}").exists()]
        assert any(secret.encode() in env for env in environs)  # it reached MLflow through the environment
    finally:
        server.stop()
