"""The config keys of the peer-uid rule and the unix control socket: [security] allowed_uids and
unknown_peer, [control] socket and tcp."""

from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path

import pytest

from ddmd.config import Config, load_config
from ddmd.config.section import runtime_dir
from ddmd.errors import ConfigError, ConfigProblems
from tests.test_config import expect_error, parse

ENV = {"HOME": "/home/user", "XDG_RUNTIME_DIR": "/run/user/1000"}


def test_defaults() -> None:
    config = Config.default(env=ENV)
    assert config.security.allowed_uids == ()
    assert config.security.unknown_peer == "allow"
    assert config.control.tcp is True
    assert config.control.socket == Path("/run/user/1000/ddmd/control-8710.sock")


def test_auto_socket_follows_the_control_port_and_the_runtime_dir() -> None:
    config = parse({"control": {"port": 9810}}, env=ENV)
    assert config.control.socket == Path("/run/user/1000/ddmd/control-9810.sock")
    # Without XDG_RUNTIME_DIR (or with a relative one): /tmp/ddmd-UID, the lock file's directory.
    fallback = Path(tempfile.gettempdir()) / f"ddmd-{os.getuid()}" / "control-8710.sock"
    assert parse({}, env={"HOME": "/h"}).control.socket == fallback
    assert parse({}, env={"HOME": "/h", "XDG_RUNTIME_DIR": "rel"}).control.socket == fallback
    assert runtime_dir({"XDG_RUNTIME_DIR": "/run/user/5"}) == Path("/run/user/5/ddmd")


def test_socket_path_forms(tmp_path) -> None:
    assert parse({"control": {"socket": ""}}, env=ENV).control.socket is None
    assert parse({"control": {"socket": "/srv/d.sock"}}, env=ENV).control.socket == Path(
        "/srv/d.sock"
    )
    assert parse({"control": {"socket": "~/d.sock"}}, env=ENV).control.socket == Path(
        "/home/user/d.sock"
    )
    file = tmp_path / "c.toml"
    file.write_text('[control]\nsocket = "run/d.sock"\n')
    assert load_config(file, env=ENV).control.socket == tmp_path / "run" / "d.sock"


def test_socket_path_takes_environment_variables() -> None:
    # The form the issue and systemd users write: the variable, not its value.
    written = {"control": {"socket": "$XDG_RUNTIME_DIR/ddmd/control.sock"}}
    assert parse(written, env=ENV).control.socket == Path("/run/user/1000/ddmd/control.sock")
    braced = {"control": {"socket": "${XDG_RUNTIME_DIR}/d-$$.sock"}}
    assert parse(braced, env=ENV).control.socket == Path("/run/user/1000/d-$.sock")
    state = {"debugger": {"state_file": "$HOME/ports.json"}}
    assert parse(state, env=ENV).debugger.state_file == Path("/home/user/ports.json")


@pytest.mark.parametrize("env", [{"HOME": "/h"}, {"HOME": "/h", "XDG_RUNTIME_DIR": ""}])
def test_socket_path_with_an_unset_variable_names_it(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse({"control": {"socket": "$XDG_RUNTIME_DIR/ddmd/control.sock"}}, env=env)
    text = str(info.value)
    assert "[control] socket" in text
    assert "$XDG_RUNTIME_DIR is not set" in text
    assert "write the path without it" in text


def test_a_stray_dollar_in_a_path_says_how_to_write_one() -> None:
    expect_error(
        {"control": {"socket": "/run/$/d.sock"}},
        "control.socket",
        None,
        'a "$" must start a variable',
        "write $$",
    )
    expect_error(
        {"debugger": {"state_file": "/var/${x/ports.json"}},
        "debugger.state_file",
        None,
        'a "$" must start a variable',
    )


def test_socket_path_too_long() -> None:
    long_path = "/" + "d" * 120 + "/c.sock"
    expect_error(
        {"control": {"socket": long_path}}, "control.socket", None, "bytes long", "at most 107"
    )
    # "auto" under a long XDG_RUNTIME_DIR names the path it would have used.
    with pytest.raises(ConfigError) as info:
        parse({}, env={"XDG_RUNTIME_DIR": "/" + "r" * 110})
    assert "control-8710.sock" in str(info.value)
    assert "[control] socket" in str(info.value)
    # So does a path that a variable made too long.
    with pytest.raises(ConfigError) as info:
        parse({"control": {"socket": "$LONG/c.sock"}}, env={**ENV, "LONG": "/" + "v" * 110})
    assert f"(/{'v' * 110}/c.sock)" in str(info.value)


def test_socket_must_be_a_string() -> None:
    expect_error({"control": {"socket": 5}}, "control.socket", "5", "expected a string")


def test_tcp_off() -> None:
    config = parse({"control": {"tcp": False}}, env=ENV)
    assert config.control.tcp is False
    assert config.control.socket is not None
    expect_error({"control": {"tcp": "no"}}, "control.tcp", "'no'", "expected true or false")


def test_tcp_off_and_no_socket_is_an_error() -> None:
    err = expect_error(
        {"control": {"tcp": False, "socket": ""}},
        "control.tcp",
        "false",
        "would not listen at all",
    )
    assert "[control] socket" in str(err)


def test_allowed_uids_numbers_and_names() -> None:
    nobody = pwd.getpwuid(65534).pw_name if _has_uid(65534) else None
    config = parse({"security": {"allowed_uids": [1001, 0, 1001]}}, env=ENV)
    assert config.security.allowed_uids == (1001, 0)  # duplicates dropped, order kept
    if nobody is not None:
        named = parse({"security": {"allowed_uids": [nobody, 1001]}}, env=ENV)
        assert named.security.allowed_uids == (65534, 1001)


def _has_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


def test_allowed_uids_names_this_user() -> None:
    me = pwd.getpwuid(os.getuid())
    config = parse({"security": {"allowed_uids": [me.pw_name]}}, env=ENV)
    assert config.security.allowed_uids == (me.pw_uid,)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (["no-such-user-ddmd"], "no user named 'no-such-user-ddmd'"),
        ([-1], "user id -1 is outside"),
        ([2**32], "is outside"),
        ([1.5], "neither"),
        ([True], "neither"),
        ([""], "neither"),
        ("1000", "expected a list of user ids or user names"),
        (1000, "expected a list"),
    ],
)
def test_allowed_uids_problems(value, fragment) -> None:
    expect_error({"security": {"allowed_uids": value}}, "security.allowed_uids", None, fragment)


def test_unknown_peer() -> None:
    assert parse({"security": {"unknown_peer": "refuse"}}, env=ENV).security.unknown_peer == (
        "refuse"
    )
    assert parse({"security": {"unknown_peer": "ALLOW"}}, env=ENV).security.unknown_peer == (
        "allow"
    )
    expect_error(
        {"security": {"unknown_peer": "maybe"}},
        "security.unknown_peer",
        "'maybe'",
        "must be one of 'allow', 'refuse'",
    )


def test_all_problems_of_the_new_keys_together() -> None:
    with pytest.raises(ConfigProblems) as info:
        parse(
            {
                "security": {"allowed_uids": ["no-such-user-ddmd"], "unknown_peer": 1},
                "control": {"tcp": 3, "socket": 4},
            },
            env=ENV,
        )
    keys = sorted(p.key for p in info.value.problems if p.key is not None)
    assert keys == [
        "control.socket",
        "control.tcp",
        "security.allowed_uids",
        "security.unknown_peer",
    ]
