"""The pure parts of a shared tracking server (issue 50): where `gtep server` may listen, its auth settings, the
credentials' checks and redaction, and `gtep users`' arguments against a fake MLflow auth client. A real
server with users is tests/cluster/test_auth_server.py."""
from __future__ import annotations

import http.server
import stat
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from gtep.cli import app
from gtep.cli.tracking import auth_environment, check_bind, is_loopback, mlflow_server_command
from gtep.config import ConfigError
from gtep.orchestration import tracking_auth, tracking_users
from gtep.orchestration.tracking_store import check_tracking

SECRET = "s3cret-password-77"
CREDENTIALS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
               "MLFLOW_AUTH_ADMIN_PASSWORD", "MLFLOW_AUTH_ADMIN_USERNAME", "GTEP_AUTH_DATABASE_URI")


@pytest.fixture(autouse=True)
def no_credentials(monkeypatch, tmp_path):
    """No credentials of the machine's user leak in: an empty HOME (no ~/.mlflow/credentials), none set."""
    for name in CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), input=input)


# ---------------------------------------------------------------- where the server listens

@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_loopback_hosts_need_no_auth(host):
    assert is_loopback(host)
    check_bind(host, auth=False, insecure=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "head-node"])
def test_a_server_beyond_this_machine_without_auth_is_refused(host):
    assert not is_loopback(host)
    with pytest.raises(ConfigError, match="--host.*--auth.*--insecure"):
        check_bind(host, auth=False, insecure=False)
    check_bind(host, auth=True, insecure=False)
    check_bind(host, auth=False, insecure=True)


def test_gtep_server_refuses_0_0_0_0_without_auth_before_starting(tmp_path):
    result = invoke("server", "--host", "0.0.0.0", "--port", "5999", "--backend-store-uri",
                    f"sqlite:///{tmp_path}/srv/mlflow.db", "--artifacts-destination", str(tmp_path / "srv" / "a"))
    assert result.exit_code == 2, result.output
    assert "--host" in result.output and "--auth" in result.output
    assert not (tmp_path / "srv").exists()  # refused before anything was made


def test_auth_config_without_auth_is_refused(tmp_path):
    result = invoke("server", "--auth-config", str(tmp_path / "auth.ini"), "--port", "5999")
    assert result.exit_code == 2 and "--auth-config" in result.output


def test_the_server_command_carries_the_auth_app_and_no_secret():
    cmd = mlflow_server_command("sqlite:///x.db", "art", "0.0.0.0", 5000, 2, auth=True)
    assert cmd[-2:] == ["--app-name", "basic-auth"]
    assert "--app-name" not in mlflow_server_command("sqlite:///x.db", "art", "127.0.0.1", 5000, 2)


# ---------------------------------------------------------------- the auth settings

def test_a_new_users_database_needs_the_admin_password(tmp_path):
    with pytest.raises(ConfigError, match="MLFLOW_AUTH_ADMIN_PASSWORD"):
        auth_environment(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "art"), None, "READ", {})


def test_the_auth_config_gtep_writes_is_private_and_holds_no_password(tmp_path):
    env = auth_environment(f"sqlite:///{tmp_path}/mlflow.db", str(tmp_path / "art"), None, "NO_PERMISSIONS",
                           {"MLFLOW_AUTH_ADMIN_PASSWORD": SECRET})
    ini = Path(env["MLFLOW_AUTH_CONFIG_PATH"])
    assert ini.parent == tmp_path and stat.S_IMODE(ini.stat().st_mode) == 0o600
    text = ini.read_text()
    assert SECRET not in text and "default_permission = NO_PERMISSIONS" in text
    assert f"database_uri = sqlite:///{tmp_path / 'basic_auth.db'}" in text
    assert "auth_cache_ttl_seconds = 60" in text  # else a password hash check (~0.7 s here) on every write
    assert len(env["MLFLOW_FLASK_SERVER_SECRET_KEY"]) >= 32  # the workers share one CSRF key
    assert "MLFLOW_AUTH_ADMIN_PASSWORD" not in env  # MLflow reads it from the environment it already is in


def test_a_bad_default_permission_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="--default-permission"):
        auth_environment(f"sqlite:///{tmp_path}/mlflow.db", "art", None, "EDIT", {"MLFLOW_AUTH_ADMIN_PASSWORD": "x"})


def test_an_auth_file_others_can_read_with_the_admin_password_is_refused(tmp_path):
    ini = tmp_path / "auth.ini"
    ini.write_text(f"[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///a.db\nadmin_password = {SECRET}\n")
    ini.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600") as refused:
        auth_environment("sqlite:///m.db", "art", ini, "READ", {})
    assert SECRET not in str(refused.value)
    ini.chmod(0o600)
    assert auth_environment("sqlite:///m.db", "art", ini, "READ", {})["MLFLOW_AUTH_CONFIG_PATH"] == str(ini)


def test_an_auth_file_without_its_keys_is_refused(tmp_path):
    ini = tmp_path / "auth.ini"
    ini.write_text("[mlflow]\ndefault_permission = READ\n")
    with pytest.raises(ConfigError, match="database_uri"):
        auth_environment("sqlite:///m.db", "art", ini, "READ", {"MLFLOW_AUTH_ADMIN_PASSWORD": "x"})


# ---------------------------------------------------------------- credentials: their source, kept out of messages

def test_the_credential_source_names_where_they_come_from_never_the_password(monkeypatch, tmp_path):
    assert tracking_auth.credential_source().startswith("no credentials")
    creds = tmp_path / "home" / ".mlflow" / "credentials"
    creds.parent.mkdir(parents=True)
    creds.write_text(f"[mlflow]\nmlflow_tracking_username = carol\nmlflow_tracking_password = {SECRET}\n")
    assert tracking_auth.credential_source() == f"{creds} (user 'carol')"
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "other-secret-99")
    source = tracking_auth.credential_source()
    assert "alice" in source and "other-secret-99" not in source and SECRET not in source


def test_redact_takes_out_every_secret_the_process_holds(monkeypatch, tmp_path):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "tok-123456789")
    text = f"failed: Authorization {SECRET} and tok-123456789 at http://u:pw9@h:5000/api"
    out = tracking_auth.redact(text, "http://u:pw9@h:5000")
    assert SECRET not in out and "tok-123456789" not in out and "pw9" not in out and out.count("***") == 3


def test_a_password_in_the_tracking_address_is_refused_without_repeating_it():
    # before: the server check ran first and printed the address, password and all, in "no MLflow server answers"
    with pytest.raises(ConfigError, match="carries a password") as refused:
        check_tracking("http://alice:pw-in-uri-1@127.0.0.1:1")
    assert "pw-in-uri-1" not in str(refused.value) and "alice:***@127.0.0.1:1" in str(refused.value)


class FakeServer(http.server.BaseHTTPRequestHandler):
    """Answers every request with the status of its class attribute (a server with authentication's 401/403)."""
    status = 200
    seen: list[str] = []

    def _answer(self) -> None:
        FakeServer.seen.append(self.headers.get("Authorization", ""))
        body = b"{}" if self.status == 200 else b"Permission denied"
        self.send_response(self.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def fake_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), FakeServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    FakeServer.seen = []
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_refused_credential_is_one_line_naming_its_source(fake_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    FakeServer.status = 200
    tracking_auth.check_credentials(fake_server)
    assert FakeServer.seen[-1].startswith("Basic ")  # MLflow's client sent the credentials
    FakeServer.status = 401
    with pytest.raises(ConfigError) as refused:
        tracking_auth.check_credentials(fake_server)
    message = str(refused.value)
    assert "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD (user 'alice')" in message and "\n" not in message
    assert SECRET not in message


def test_a_user_without_edit_is_refused_naming_the_study_and_the_permission(fake_server, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    FakeServer.status = 403
    with pytest.raises(ConfigError, match="may not write study 'team-study'.*EDIT.*gtep users grant"):
        tracking_auth.check_can_write(fake_server, "team-study", "7")
    FakeServer.status = 200
    tracking_auth.check_can_write(fake_server, "team-study", "7")


@pytest.mark.parametrize("error, status", [
    (Exception("API request to endpoint /x failed with error code 403 != 200. Response body: 'Permission denied'"),
     403),
    (Exception("API request to endpoint /x failed with error code 401 != 200."), 401),
    (SimpleNamespace(error_code="PERMISSION_DENIED"), 403),
    (ConnectionError("Connection refused"), None),
])
def test_a_refusal_is_told_from_an_outage(error, status):
    assert tracking_auth.refusal(error) == status  # an outage is waited for, a refusal is final


# ---------------------------------------------------------------- gtep users, against a fake auth client

class FakeAuth:
    def __init__(self, new_api: bool = True, fail: Exception | None = None) -> None:
        self.calls: list[tuple] = []
        self.fail = fail
        if new_api:
            self.grant_user_permission = self._grant

    def create_user(self, username: str, password: str) -> None:
        if self.fail:
            raise self.fail
        self.calls.append(("create_user", username, password))

    def update_user_password(self, username: str, password: str, current_password: str | None = None) -> None:
        self.calls.append(("update_user_password", username, password, current_password))

    def _grant(self, username, resource_type, resource_id, permission) -> None:
        if self.fail:
            raise self.fail
        self.calls.append(("grant", username, resource_type, resource_id, permission))

    def create_experiment_permission(self, experiment_id, username, permission) -> None:
        if any(call[0] == "create" for call in self.calls):
            raise Exception("RESOURCE_ALREADY_EXISTS: permission already exists")
        self.calls.append(("create", experiment_id, username, permission))

    def update_experiment_permission(self, experiment_id, username, permission) -> None:
        self.calls.append(("update", experiment_id, username, permission))


class FakeTracking:
    def get_experiment_by_name(self, name: str):
        return SimpleNamespace(experiment_id="42") if name == "gtep/team-study" else None


@pytest.fixture
def fake_clients(monkeypatch):
    auth = FakeAuth()
    monkeypatch.setattr(tracking_users, "clients", lambda uri: (auth, FakeTracking()))
    monkeypatch.setattr(tracking_users, "check_answers", lambda uri: None)  # no server: the fake answers
    return auth


URI = "http://127.0.0.1:5000"


def test_users_add_sends_the_password_from_stdin_and_never_prints_it(fake_clients):
    result = invoke("users", "add", "alice", "--tracking-uri", URI, "--password-stdin", input=SECRET + "\n")
    assert result.exit_code == 0, result.output
    assert fake_clients.calls == [("create_user", "alice", SECRET)]
    assert SECRET not in result.output


def test_users_add_asks_twice_at_a_hidden_prompt(fake_clients):
    result = invoke("users", "add", "alice", "--tracking-uri", URI, input=f"{SECRET}\n{SECRET}\n")
    assert result.exit_code == 0, result.output
    assert fake_clients.calls == [("create_user", "alice", SECRET)]


def test_users_grant_gives_the_permission_on_the_study_experiment(fake_clients):
    result = invoke("users", "grant", "bob", "team-study", "edit", "--tracking-uri", URI)
    assert result.exit_code == 0, result.output
    assert fake_clients.calls == [("grant", "bob", "experiment", "42", "EDIT")]


def test_users_grant_on_an_older_mlflow_creates_then_updates():
    auth = FakeAuth(new_api=False)
    tracking_users.grant(auth, FakeTracking(), URI, "bob", "team-study", "READ")
    tracking_users.grant(auth, FakeTracking(), URI, "bob", "team-study", "MANAGE")
    assert auth.calls == [("create", "42", "bob", "READ"), ("update", "42", "bob", "MANAGE")]


def test_users_password_of_ones_own_gives_the_current_one(fake_clients, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "old-password-12")
    result = invoke("users", "password", "alice", "--tracking-uri", URI, "--password-stdin", input=SECRET + "\n")
    assert result.exit_code == 0, result.output
    assert fake_clients.calls == [("update_user_password", "alice", SECRET, "old-password-12")]


@pytest.mark.parametrize("args, input, named", [
    (["grant", "bob", "team-study", "WRITE"], None, "PERMISSION"),
    (["grant", "bob", "no-such-study", "READ"], None, "STUDY"),
    (["add", "a:b", "--password-stdin"], SECRET, "USERNAME"),
    (["add", "alice", "--password-stdin"], "", "password"),
    (["add", "alice", "--password-stdin"], "alice", "password"),
], ids=["permission", "study", "username-colon", "empty-password", "password-is-name"])
def test_users_bad_arguments_are_one_line_naming_them(fake_clients, args, input, named):
    result = invoke("users", *args, "--tracking-uri", URI, input=None if input is None else input + "\n")
    assert result.exit_code == 2, result.output
    assert f"error: {named}" in result.output and result.output.strip().count("\n") == 0, result.output
    assert not fake_clients.calls  # refused before the server was asked to change anything


@pytest.mark.parametrize("uri", [None, "sqlite:///x.db", "http://admin:pw-here-1@127.0.0.1:5000"])
def test_users_need_a_server_address_without_a_password(fake_clients, uri):
    result = invoke("users", "add", "alice", "--password-stdin", *(["--tracking-uri", uri] if uri else []),
                    input=SECRET + "\n")
    assert result.exit_code == 2 and "--tracking-uri" in result.output
    assert "pw-here-1" not in result.output and not fake_clients.calls


def test_a_server_refusal_is_one_line_without_the_password(monkeypatch):
    auth = FakeAuth(fail=Exception("API request to endpoint /x failed with error code 403 != 200."))
    monkeypatch.setattr(tracking_users, "clients", lambda uri: (auth, FakeTracking()))
    monkeypatch.setattr(tracking_users, "check_answers", lambda uri: None)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "bob")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    result = invoke("users", "grant", "carol", "team-study", "READ", "--tracking-uri", URI)
    assert result.exit_code == 2
    assert "may not grant READ on study 'team-study'" in result.output and SECRET not in result.output


def test_an_existing_user_is_told_to_set_its_password_instead(monkeypatch):
    auth = FakeAuth(fail=Exception("RESOURCE_ALREADY_EXISTS: User 'alice' already exists"))
    monkeypatch.setattr(tracking_users, "clients", lambda uri: (auth, FakeTracking()))
    monkeypatch.setattr(tracking_users, "check_answers", lambda uri: None)
    result = invoke("users", "add", "alice", "--tracking-uri", URI, "--password-stdin", input=SECRET + "\n")
    assert result.exit_code == 2 and "gtep users password" in result.output



# ---------------------------------------------------------------- TLS through a reverse proxy

NGINX = Path(__file__).resolve().parents[2] / "clusters" / "tls" / "nginx.conf"


def nginx_blocks(text: str) -> dict[str, list[str]]:
    """nginx's syntax, lightly: comments dropped, every statement ends in ';', braces balance; each block's name
    ('upstream gtep_mlflow', 'server', 'location /') -> its statements (the last block of a name wins)."""
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    blocks: dict[str, list[str]] = {}
    stack: list[str] = []
    statement = ""
    for char in code:
        if char == "{":
            stack.append(statement.strip())
            blocks[stack[-1]] = []
            statement = ""
        elif char == "}":
            assert not statement.strip(), f"a statement without ';' before '}}': {statement.strip()!r}"
            assert stack, "an unopened '}'"
            stack.pop()
        elif char == ";":  # a statement outside any block is in nginx's http context (conf.d is included there)
            blocks.setdefault(stack[-1] if stack else "http", []).append(" ".join(statement.split()))
            statement = ""
        else:
            statement += char
    assert not stack and not statement.strip(), "unclosed block or a statement without ';'"
    return blocks


def test_the_tls_proxy_example_parses_and_passes_to_the_loopback_server():
    text = NGINX.read_text()
    blocks = nginx_blocks(text)
    upstream = blocks["upstream gtep_mlflow"]
    assert "server 127.0.0.1:5000" in upstream
    assert "proxy_pass http://gtep_mlflow" in blocks["location /"]
    https = blocks["server"]  # the last server block: the one on 443
    assert "listen 443 ssl" in https and any(s.startswith("ssl_certificate ") for s in https)
    # wrong logins are counted and slowed per client address (MLflow never does); the study's requests are not
    assert "limit_req_zone $binary_remote_addr zone=gtep_failed_logins:10m rate=6r/m" in blocks["http"]
    assert "error_page 401 = @refused" in blocks["location /"] and "proxy_intercept_errors on" in blocks["location /"]
    assert "limit_req zone=gtep_failed_logins burst=10" in blocks["location @refused"]
    assert "return 401" in blocks["location @refused"] and not any("limit_req " in s for s in blocks["location /"])
    # the server command it names listens on loopback, where the upstream points
    command = next(line for line in text.splitlines() if "#   gtep server" in line)
    assert "--auth" in command and "--host 127.0.0.1" in command and "--port 5000" in command


# ---------------------------------------------------------------- issue 57: a database password never on a command line

DB_URI = f"mysql://mlflow:{SECRET}@db-host:3306/mlflow"  # mysql: no driver check, so nothing but the rule refuses it


@pytest.fixture
def served(monkeypatch):
    """`gtep server` up to the point where it would start MLflow: the command and environment it would run."""
    import gtep.cli.tracking as tracking

    seen: dict = {}

    def serve(cmd, env, private=False, log=None):
        seen.update(cmd=cmd, env=env, private=private)
        return tracking.Served(code=0, stopped=True)

    monkeypatch.setattr(tracking, "serve", serve)
    return seen


def test_a_database_password_typed_on_the_command_line_is_refused_and_nothing_made(tmp_path, served):
    art = tmp_path / "srv" / "art"
    result = invoke("server", "--backend-store-uri", DB_URI, "--artifacts-destination", str(art))
    assert result.exit_code == 2, result.output
    assert "--backend-store-uri" in result.output and "GTEP_BACKEND_STORE_URI" in result.output
    assert SECRET not in result.output and not served and not (tmp_path / "srv").exists()


def test_the_store_address_from_the_environment_reaches_mlflow_in_its_environment_only(tmp_path, served,
                                                                                        monkeypatch):
    monkeypatch.setenv("GTEP_BACKEND_STORE_URI", DB_URI)
    result = invoke("server", "--artifacts-destination", str(tmp_path / "art"), "--port", "5999")
    assert result.exit_code == 0, result.output
    assert not any(SECRET in arg for arg in served["cmd"])  # the child's arguments: what ps shows
    assert served["env"]["MLFLOW_BACKEND_STORE_URI"] == DB_URI  # `mlflow server` reads it there
    assert "GTEP_BACKEND_STORE_URI" not in served["env"]
    assert SECRET not in result.output and "mlflow:***@db-host" in result.output
    assert served["private"]  # the server's own files: umask 077


def test_a_store_address_without_a_password_stays_on_the_command_line(tmp_path, served):
    result = invoke("server", "--backend-store-uri", f"sqlite:///{tmp_path}/s/mlflow.db", "--artifacts-destination",
                    str(tmp_path / "s" / "art"), "--port", "5999")
    assert result.exit_code == 0, result.output
    assert served["cmd"][served["cmd"].index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path}/s/mlflow.db"
    assert "MLFLOW_BACKEND_STORE_URI" not in served["env"]


def test_the_help_names_the_environment_variable():
    assert "GTEP_BACKEND_STORE_URI" in invoke("server", "--help").output


# ---------------------------------------------------------------- issue 57: one bind rule for every server

@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3"])
def test_gtep_ui_obeys_the_bind_rule_of_gtep_server(tmp_path, host, monkeypatch):
    import gtep.cli.tracking as tracking

    started = []
    monkeypatch.setattr(tracking, "serve", lambda cmd, env, private=False: started.append(cmd) or 0)
    result = invoke("ui", "--output", str(tmp_path), "--host", host, "--port", "5999")
    assert result.exit_code == 2, result.output
    assert "--host" in result.output and "--insecure" in result.output and not started


# ---------------------------------------------------------------- issue 57: stores private to their owner

def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_gtep_server_makes_its_folders_owner_only(tmp_path, served, monkeypatch):
    monkeypatch.setenv("MLFLOW_AUTH_ADMIN_PASSWORD", SECRET)
    store, art = tmp_path / "srv" / "db" / "mlflow.db", tmp_path / "srv" / "art"
    result = invoke("server", "--auth", "--backend-store-uri", f"sqlite:///{store}", "--artifacts-destination",
                    str(art), "--port", "5999")
    assert result.exit_code == 0, result.output
    assert mode(store.parent) == 0o700 and mode(art) == 0o700 and mode(tmp_path / "srv") == 0o700
    assert mode(store.parent / "basic_auth.ini") == 0o600


def test_a_study_store_is_owner_only(tmp_path):
    from gtep.orchestration.tracking_store import sqlite_write_ahead_log

    store = tmp_path / "runs" / "mlflow.db"
    sqlite_write_ahead_log(store)
    assert mode(store) == 0o600 and mode(store.parent) == 0o700
    assert all(mode(p) == 0o600 for p in store.parent.glob("mlflow.db*"))  # -wal and -shm take the file's mode


def test_the_private_helpers_leave_an_existing_folder_alone(tmp_path):
    from gtep.config.private import private_file, private_folder

    tmp_path.chmod(0o755)
    private_folder(tmp_path / "a" / "b")
    assert mode(tmp_path) == 0o755 and mode(tmp_path / "a") == 0o700 and mode(tmp_path / "a" / "b") == 0o700
    (tmp_path / "f").write_text("x")
    (tmp_path / "f").chmod(0o644)
    private_file(tmp_path / "f")
    assert mode(tmp_path / "f") == 0o644 and mode(private_file(tmp_path / "g")) == 0o600


# ---------------------------------------------------------------- issue 57: what a team expects of a shared server

@pytest.mark.parametrize("password", ["aaaaaaaaaaaa", "abcabcabcabc", "short-Pw-1", "Password2024!", "P@ssw0rd2024!",
                                      "qwertyuiop12", "123456789012", "iloveyou!!!!", "xx-alice-Long-99"],
                         ids=["one-char", "three-chars", "short", "common+digits", "leet", "keyboard", "digits",
                              "common+symbols", "has-name"])
def test_users_refuse_a_weak_password_without_repeating_it(fake_clients, password):
    result = invoke("users", "add", "alice", "--tracking-uri", URI, "--password-stdin", input=password + "\n")
    assert result.exit_code == 2, result.output
    assert "error: password" in result.output and password not in result.output and not fake_clients.calls


def test_the_common_password_list_is_shipped_in_the_package():
    assert {"password", "qwerty", "letmein"} <= tracking_users.common_passwords()
    assert not tracking_users.is_common("Granite-Violin-Harbor-7")


@pytest.mark.parametrize("name", ["al\x1b[2Jice", "bob\x00", "eve\u202e", "tab\tname"])
def test_users_add_refuses_control_characters_in_a_name(fake_clients, name):
    result = invoke("users", "add", name, "--tracking-uri", URI, "--password-stdin", input=SECRET + "\n")
    assert result.exit_code == 2 and "error: USERNAME" in result.output, result.output
    assert "\x1b" not in result.output and "\x00" not in result.output and not fake_clients.calls


def test_a_user_whose_credentials_are_in_the_file_changes_their_own_password(fake_clients, tmp_path):
    creds = tmp_path / "home" / ".mlflow" / "credentials"
    creds.parent.mkdir(parents=True)
    creds.write_text("[mlflow]\nmlflow_tracking_username = alice\nmlflow_tracking_password = old-Granite-4411\n")
    result = invoke("users", "password", "alice", "--tracking-uri", URI, "--password-stdin", input=SECRET + "\n")
    assert result.exit_code == 0, result.output
    assert fake_clients.calls == [("update_user_password", "alice", SECRET, "old-Granite-4411")]


def test_the_ui_of_a_read_user_skips_the_views_it_may_not_save(monkeypatch):
    from gtep.orchestration import tracking

    class Refusing:
        def search_experiments(self, **kwargs):
            return [SimpleNamespace(name="gtep/team", experiment_id="3", tags={})]

        def set_experiment_tag(self, *args):
            raise Exception("API request to endpoint /api/2.0/mlflow/experiments/set-experiment-tag failed with "
                            "error code 403 != 200. Response body: 'Permission denied'")

    monkeypatch.setattr(tracking, "MlflowClient", lambda tracking_uri: Refusing())
    assert tracking.prepare_ui("http://127.0.0.1:5000") == [("team", "3")]  # before: a 403 traceback


# ---------------------------------------------------------------- issue 57: bad input on the newest surfaces

def test_users_against_a_server_that_does_not_answer_fail_within_seconds(monkeypatch):
    import socket
    import time

    silent = socket.socket()  # accepts connections and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
    start = time.monotonic()
    try:
        result = invoke("users", "grant", "bob", "team", "READ", "--tracking-uri", uri)
    finally:
        silent.close()
    assert result.exit_code == 2 and "no MLflow server answers" in result.output, result.output
    assert time.monotonic() - start < 15  # before: MLflow's client retried for two minutes, in silence


@pytest.mark.parametrize("args", [["--auth", "--default-permission", "EDIT"], ["--auth"], ["--workers", "0"],
                                  ["--port", "0"]], ids=["permission", "no-admin-password", "workers", "port"])
def test_gtep_server_refusing_an_option_makes_nothing(tmp_path, args, served):
    result = invoke("server", "--backend-store-uri", f"sqlite:///{tmp_path}/srv/mlflow.db", "--artifacts-destination",
                    str(tmp_path / "srv" / "art"), *args)
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "srv").exists() and not served  # before: its store folders were already made


def test_the_api_refuses_an_unknown_algorithm_at_once():
    import gtep

    with pytest.raises(ConfigError, match="algorithm.*no_such_learner.*choose from"):
        gtep.experiment(preset="default", algorithm="no_such_learner")
