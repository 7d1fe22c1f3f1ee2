"""ddmd.config: defaults, the example file, each validation rule, env handling, a fuzz test."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddmd.config import (
    Config,
    PortRange,
    find_config_file,
    is_loopback_host,
    load_config,
    parse_config,
)
from ddmd.errors import ConfigError, ConfigProblems, DdmdError, format_key

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "config.example.toml"
ENV = {"HOME": "/home/user"}
SOURCE = "test.toml"


def parse(data: dict, env: dict | None = None) -> Config:
    return parse_config(data, source=SOURCE, env=ENV if env is None else env)


def section_fields(config: Config) -> dict[str, tuple[str, ...]]:
    return {
        f.name: tuple(g.name for g in dataclasses.fields(getattr(config, f.name)))
        for f in dataclasses.fields(config)
        if f.name != "source"
    }


def expect_error(data: dict, key: str, shown_value: str | None, *fragments: str) -> ConfigError:
    """parse(data) must fail naming the file, `key` (as "[section] name") and the value."""
    with pytest.raises(ConfigError) as info:
        parse(data)
    err = info.value
    text = str(err)
    assert err.path == SOURCE
    assert err.key == key
    assert text.startswith(f"{SOURCE}: ")
    assert format_key(key) in text
    if shown_value is not None:
        assert f" = {shown_value}: " in text, text
    for fragment in fragments:
        assert fragment in text, text
    assert "\n" not in text
    return err


# --- defaults and the example file


def test_defaults():
    c = Config.default(env=ENV)
    assert c.scan.enabled is True
    assert c.scan.host == "127.0.0.1"
    assert c.scan.ports == PortRange(8000, 8040)
    assert (c.scan.interval, c.scan.backoff_max) == (2.0, 60.0)
    assert (c.adb.enabled, c.adb.host, c.adb.port, c.adb.path) == ("auto", "127.0.0.1", 5037, "adb")
    assert c.debugger.host == "127.0.0.1"
    assert c.debugger.ports == PortRange(8600, 8699)
    assert c.debugger.current_port == 8700
    assert c.debugger.auto_select_waiting is True
    assert c.debugger.state_file == Path("/home/user/.local/state/ddmd/ports.json")
    assert c.debugger.queue_packets == 16384
    assert (c.debugger.queue_bytes, c.debugger.pause_limit) == (16 * 1024 * 1024, 10.0)
    assert c.debugger.relay_chunk_bytes == 1024 * 1024
    assert c.debugger.max_per_vm == 4
    assert c.debugger.relay_threads is True
    assert (c.control.host, c.control.port, c.control.token) == ("127.0.0.1", 8710, "")
    assert c.monitor == type(c.monitor)(0.5, False, True)
    assert dataclasses.astuple(c.timeouts) == (2.0, 2.0, 5.0, 30.0, 1.0, 10.0, 5.0, 5.0, 60.0)
    assert c.limits.max_packet_bytes == 1073741824
    assert c.limits.max_inflated_bytes == 64 * 1024 * 1024
    assert c.limits.max_vms == 256
    assert (c.log.format, c.log.level) == ("auto", "info")
    assert c.security.allow_non_loopback is False


def test_config_is_frozen_and_slotted():
    c = Config.default(env=ENV)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.scan.enabled = False  # type: ignore[misc]
    assert not hasattr(c.scan, "__dict__")


def test_load_none_gives_defaults():
    assert load_config(None, env=ENV) == Config.default(env=ENV)


@pytest.mark.parametrize(
    "env",
    [
        ENV,
        {"HOME": "/h", "XDG_STATE_HOME": "/state", "ANDROID_ADB_SERVER_PORT": "5099"},
    ],
)
def test_example_file_equals_defaults(env):
    assert load_config(EXAMPLE, env=env) == Config.default(env=env)


def test_example_file_documents_every_key():
    text = EXAMPLE.read_text()
    data = tomllib.loads(text)
    fields = section_fields(Config.default(env=ENV))
    assert set(data) == set(fields)
    for section, keys in fields.items():
        for key in keys:
            if (section, key) == ("adb", "port"):
                # Left commented out so that ANDROID_ADB_SERVER_PORT keeps working.
                assert "# port = 5037" in text
            else:
                assert key in data[section], f"[{section}] {key} missing from the example"


def test_source_is_not_part_of_equality(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text("")
    loaded = load_config(file, env=ENV)
    assert loaded.source == str(file)
    assert loaded == Config.default(env=ENV)


# --- PortRange


def test_port_range_parse_and_protocols():
    r = PortRange.parse("8600-8699")
    assert r == PortRange(8600, 8699)
    assert PortRange.parse(" 8000 - 8002 ") == PortRange(8000, 8002)
    assert PortRange.parse(8700) == PortRange(8700, 8700)
    assert PortRange.parse("8700") == PortRange(8700, 8700)
    assert 8600 in r
    assert 8699 in r
    assert 8700 not in r
    assert True not in PortRange(1, 2)
    assert "8600" not in r
    assert len(r) == 100
    assert list(PortRange(1, 3)) == [1, 2, 3]
    assert str(r) == "8600-8699"
    assert str(PortRange(5, 5)) == "5"
    assert r.overlaps(PortRange(8699, 9000))
    assert not r.overlaps(PortRange(8700, 9000))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("9000-8000", "start port is above end port"),
        ("0-10", "outside 1-65535"),
        ("8000-70000", "outside 1-65535"),
        (0, "outside 1-65535"),
        ("80a0", "expected a port range"),
        ("8000-", "expected a port range"),
        ("-8000", "expected a port range"),
        ("8000..9000", "expected a port range"),
        ("٨٠٠٠", "expected a port range"),  # non-ASCII digits
        (True, "expected a port range"),
    ],
)
def test_port_range_rejects(value, message):
    with pytest.raises(ValueError, match=message):
        PortRange.parse(value)


# --- the error message shape


def test_format_key():
    assert format_key("debugger.ports") == "[debugger] ports"
    assert format_key("scan") == "[scan]"


def test_config_error_reads_like_the_spec():
    err = ConfigError(
        "start port is above end port", path="config.toml", key="scan.ports", value="9000-8000"
    )
    assert str(err) == "config.toml: [scan] ports = '9000-8000': start port is above end port"
    assert isinstance(err, DdmdError)
    assert (err.path, err.key, err.value) == ("config.toml", "scan.ports", "9000-8000")
    assert str(ConfigError("no such file", path="x.toml")) == "x.toml: no such file"


def test_odd_keys_are_quoted():
    err = expect_error({"scan": {"a b": 1}}, "scan.a b", "1", "unknown key")
    assert '[scan] "a b" = 1' in str(err)
    assert str(ConfigError("x", key="\n")) == '["\\n"]: x'


def test_long_values_are_shortened():
    err = ConfigError("bad", path="c.toml", key="scan.host", value="x" * 500)
    assert len(str(err)) < 120


# --- validation rules


def test_unknown_section_suggests_close_match():
    expect_error({"sacn": {}}, "sacn", None, "unknown section", "did you mean 'scan'", "debugger")


def test_unknown_section_without_close_match_lists_sections():
    err = expect_error({"zzz": {"a": 1}}, "zzz", None, "unknown section", "sections: scan, adb")
    assert "did you mean" not in str(err)


def test_unknown_key_suggests_and_lists_allowed():
    expect_error(
        {"scan": {"prots": "8000-8040"}},
        "scan.prots",
        "'8000-8040'",
        "unknown key",
        "did you mean 'ports'",
        "keys in [scan]: enabled, host, ports, interval, backoff_max",
    )


def test_top_level_key_points_at_its_sections():
    expect_error({"ports": "8000-8040"}, "ports", "'8000-8040'", "[scan] ports or [debugger] ports")


def test_section_must_be_a_table():
    expect_error({"scan": 5}, "scan", "5", "expected a [scan] table, got an integer")


@pytest.mark.parametrize(
    ("section", "key", "value", "shown", "fragment"),
    [
        ("scan", "enabled", "yes", "'yes'", "expected true or false, got a string"),
        ("control", "port", True, "true", "got a boolean"),
        ("debugger", "current_port", False, "false", "got a boolean"),
        ("limits", "max_vms", True, "true", "expected an integer, got a boolean"),
        ("debugger", "queue_packets", 1.5, "1.5", "expected an integer, got a float"),
        ("scan", "interval", "fast", "'fast'", "expected a number of seconds, got a string"),
        ("timeouts", "connect", True, "true", "got a boolean"),
        ("scan", "host", 127, "127", "expected a string, got an integer"),
        ("scan", "ports", 1.5, "1.5", "got a float"),
        ("scan", "ports", True, "true", "got a boolean"),
        ("scan", "ports", [8000, 8040], "[8000, 8040]", "got an array"),
        ("log", "level", 1, "1", "got an integer"),
        ("adb", "path", 5, "5", "expected a string"),
        ("adb", "path", "", "''", "must not be empty"),
        ("control", "token", 1234, "1234", "expected a string"),
        ("debugger", "state_file", 1, "1", "expected a string"),
        ("monitor", "heap_info", 1, "1", "expected true or false, got an integer"),
        ("security", "allow_non_loopback", "true", "'true'", "expected true or false"),
    ],
)
def test_wrong_types(section, key, value, shown, fragment):
    expect_error({section: {key: value}}, f"{section}.{key}", shown, fragment)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("control", "port", 0),
        ("control", "port", 65536),
        ("debugger", "current_port", -1),
        ("adb", "port", 70000),
    ],
)
def test_ports_outside_range(section, key, value):
    expect_error({section: {key: value}}, f"{section}.{key}", str(value), "between 1 and 65535")


@pytest.mark.parametrize(
    ("section", "value", "fragment"),
    [
        ("scan", "9000-8000", "start port is above end port"),
        ("debugger", "8699-8600", "start port is above end port"),
        ("scan", "0-10", "outside 1-65535"),
        ("debugger", "8600-70000", "outside 1-65535"),
        ("scan", "8000:8040", "expected a port range"),
    ],
)
def test_bad_port_ranges(section, value, fragment):
    expect_error({section: {"ports": value}}, f"{section}.ports", repr(value), fragment)


def test_current_port_inside_debugger_ports():
    expect_error(
        {"debugger": {"current_port": 8650}},
        "debugger.current_port",
        "8650",
        "inside [debugger] ports (8600-8699)",
    )


def test_control_port_inside_debugger_ports():
    expect_error(
        {"control": {"port": 8600}}, "control.port", "8600", "inside [debugger] ports (8600-8699)"
    )


def test_control_port_equal_to_current_port():
    expect_error(
        {"control": {"port": 8700}}, "control.port", "8700", "same as [debugger] current_port"
    )


def test_debugger_range_moved_onto_current_port():
    expect_error(
        {"debugger": {"ports": "8650-8750"}},
        "debugger.current_port",
        "8700",
        "inside [debugger] ports (8650-8750)",
    )


@pytest.mark.parametrize(
    ("ports", "fragment"),
    [
        ("8000-8650", "overlaps [debugger] ports (8600-8699)"),
        ("8699", "overlaps [debugger] ports"),
        ("8700-8705", "includes [debugger] current_port (8700)"),
        (8710, "includes [control] port (8710)"),
    ],
)
def test_scan_range_overlaps_own_ports(ports, fragment):
    expect_error({"scan": {"ports": ports}}, "scan.ports", repr(ports), fragment)


def test_scan_overlap_ignored_when_scan_disabled():
    c = parse({"scan": {"enabled": False, "ports": "8000-8800"}})
    assert c.scan.ports == PortRange(8000, 8800)


def test_moved_ports_are_accepted():
    c = parse(
        {
            "scan": {"ports": 9000},
            "debugger": {"ports": "18600-18699", "current_port": 18700},
            "control": {"port": 18710},
        }
    )
    assert c.scan.ports == PortRange(9000, 9000)
    assert c.debugger.current_port == 18700


@pytest.mark.parametrize("key", ["connect", "handshake", "ddm_request", "jdwp_request", "dbgd_ack"])
@pytest.mark.parametrize("value", [0, -1, 0.0, -0.5, math.nan, math.inf])
def test_timeouts_must_be_positive(key, value):
    expect_error(
        {"timeouts": {key: value}}, f"timeouts.{key}", repr(value), "positive, finite number"
    )


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("timeouts", "reconnect"),
        ("timeouts", "adb"),
        ("timeouts", "shutdown_grace"),
        ("scan", "interval"),
        ("scan", "backoff_max"),
        ("monitor", "thread_poll_interval"),
    ],
)
def test_intervals_must_be_positive(section, key):
    expect_error({section: {key: 0}}, f"{section}.{key}", "0", "positive")


def test_huge_integer_seconds_are_an_error_not_a_crash():
    expect_error({"timeouts": {"connect": 10**400}}, "timeouts.connect", None, "positive, finite")


def test_integer_seconds_are_accepted_as_floats():
    c = parse({"timeouts": {"connect": 3}})
    assert c.timeouts.connect == 3.0
    assert isinstance(c.timeouts.connect, float)


def test_backoff_below_interval():
    expect_error(
        {"scan": {"interval": 5, "backoff_max": 2}},
        "scan.backoff_max",
        "2",
        "must not be below [scan] interval (5 s)",
    )


@pytest.mark.parametrize(
    ("section", "host"),
    [
        ("debugger", "0.0.0.0"),
        ("debugger", "::"),
        ("control", "192.168.1.2"),
        ("control", "example.com"),
    ],
)
def test_non_loopback_listening_host_needs_permission(section, host):
    expect_error(
        {section: {"host": host}},
        f"{section}.host",
        repr(host),
        "not a loopback address",
        "[security] allow_non_loopback = true",
    )
    c = parse({section: {"host": host}, "security": {"allow_non_loopback": True}})
    assert getattr(c, section).host == host


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST.", "::1", "127.0.0.2", "ddmd.localhost"])
def test_loopback_listening_hosts_are_fine(host):
    assert parse({"debugger": {"host": host}, "control": {"host": host}}).control.host == host


def test_connect_hosts_need_no_permission():
    c = parse({"scan": {"host": "10.0.0.5"}, "adb": {"host": "adb-server.example"}})
    assert (c.scan.host, c.adb.host) == ("10.0.0.5", "adb-server.example")


def test_is_loopback_host():
    assert is_loopback_host("127.0.0.1")
    assert is_loopback_host("::ffff:127.0.0.1")
    assert is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0")
    assert not is_loopback_host("::ffff:10.0.0.1")
    assert not is_loopback_host("notlocalhost")


@pytest.mark.parametrize(
    ("host", "fragment"),
    [
        ("", "must not be empty"),
        ("local host", "not an IP address or host name"),
        ("[::1]", "without brackets"),
        ("300.1.1.1", "not a valid IP address"),
        ("-bad.example", "not an IP address or host name"),
        ("a..b", "not an IP address or host name"),
        ("a" * 64 + ".example", "not an IP address or host name"),
        ("host\x00", "NUL"),
    ],
)
@pytest.mark.parametrize("section", ["scan", "adb", "debugger", "control"])
def test_invalid_hosts(section, host, fragment):
    expect_error({section: {"host": host}}, f"{section}.host", None, fragment)


@pytest.mark.parametrize(
    ("section", "key", "value", "fragment"),
    [
        ("adb", "enabled", "maybe", "must be one of 'auto', 'on', 'off'"),
        ("log", "format", "xml", "must be one of 'auto', 'json', 'console'"),
        ("log", "level", "verbose", "must be one of 'debug', 'info', 'warning', 'error'"),
    ],
)
def test_bad_enum_strings(section, key, value, fragment):
    expect_error({section: {key: value}}, f"{section}.{key}", repr(value), fragment)


def test_enum_spellings():
    assert parse({"adb": {"enabled": True}}).adb.enabled == "on"
    assert parse({"adb": {"enabled": False}}).adb.enabled == "off"
    assert parse({"log": {"level": "DEBUG", "format": "JSON"}}).log == type(
        Config.default(env=ENV).log
    )("json", "debug")


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("max_packet_bytes", 10, "between 11 and 4294967295"),
        ("max_packet_bytes", 2**32, "between 11 and 4294967295"),
        ("max_inflated_bytes", 0, ">= 1"),
        ("max_vms", 0, ">= 1"),
    ],
)
def test_limits(key, value, fragment):
    expect_error({"limits": {key: value}}, f"limits.{key}", str(value), fragment)


@pytest.mark.parametrize(("value", "fragment"), [(0, "between 1 and 64"), (65, "between 1 and 64")])
def test_max_per_vm_bounds(value, fragment):
    expect_error({"debugger": {"max_per_vm": value}}, "debugger.max_per_vm", str(value), fragment)


def test_relay_threads_can_be_turned_off_and_must_be_a_boolean():
    c = parse_config({"debugger": {"relay_threads": False}}, source="test", env=ENV)
    assert c.debugger.relay_threads is False
    # The words it took before it became a boolean still start ddmd.
    for word, on in (("local", True), ("ALL", True), ("off", False)):
        c = parse_config({"debugger": {"relay_threads": word}}, source="test", env=ENV)
        assert c.debugger.relay_threads is on
    expect_error(
        {"debugger": {"relay_threads": "yes"}},
        "debugger.relay_threads",
        None,
        "expected true or false",
    )


def test_max_per_vm_one_restores_a_single_debugger():
    c = parse_config({"debugger": {"max_per_vm": 1}}, source="test", env=ENV)
    assert c.debugger.max_per_vm == 1


@pytest.mark.parametrize(("key", "minimum"), [("queue_packets", 1), ("relay_chunk_bytes", 4096)])
def test_debugger_sizes_have_a_minimum(key, minimum):
    expect_error(
        {"debugger": {key: minimum - 1}}, f"debugger.{key}", str(minimum - 1), f">= {minimum}"
    )


def test_top_level_must_be_a_table():
    with pytest.raises(ConfigError, match="top level"):
        parse_config([], source=SOURCE, env=ENV)  # type: ignore[arg-type]


# --- files


def test_invalid_toml_reports_line_and_column(tmp_path):
    file = tmp_path / "bad.toml"
    file.write_text('[scan]\nports = "8000-8040\n')
    with pytest.raises(ConfigError) as info:
        load_config(file, env=ENV)
    text = str(info.value)
    assert text.startswith(f"{file}: not valid TOML")
    assert "line 2" in text
    assert "column" in text


def test_error_from_a_file_names_the_file(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('[scan]\nports = "9000-8000"\n')
    with pytest.raises(ConfigError) as info:
        load_config(file, env=ENV)
    assert str(info.value) == f"{file}: [scan] ports = '9000-8000': start port is above end port"


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing, env=ENV)
    assert info.value.path == str(missing)
    assert str(info.value) == f"{missing}: no such file"


def test_directory_and_binary_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, env=ENV)
    binary = tmp_path / "b.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(binary, env=ENV)


def test_load_accepts_str_paths(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text("[control]\nport = 9710\n")
    assert load_config(str(file), env=ENV).control.port == 9710


# --- environment


def test_adb_port_from_env():
    assert parse({}, env={**ENV, "ANDROID_ADB_SERVER_PORT": "5038"}).adb.port == 5038
    assert parse({}, env={**ENV, "ANDROID_ADB_SERVER_PORT": ""}).adb.port == 5037


def test_adb_port_in_file_wins_over_env():
    env = {**ENV, "ANDROID_ADB_SERVER_PORT": "5038"}
    assert parse({"adb": {"port": 6000}}, env=env).adb.port == 6000


@pytest.mark.parametrize("raw", ["abc", "0", "70000", "-1", "50 37", "٥٠٣٧"])
def test_adb_port_bad_env(raw):
    with pytest.raises(ConfigError) as info:
        parse({}, env={**ENV, "ANDROID_ADB_SERVER_PORT": raw})
    err = info.value
    assert err.key == "adb.port"
    assert err.value == raw
    assert "ANDROID_ADB_SERVER_PORT" in str(err)
    assert f"[adb] port = {raw!r}" in str(err)


def test_bad_env_port_ignored_when_file_sets_port():
    assert parse({"adb": {"port": 5037}}, env={**ENV, "ANDROID_ADB_SERVER_PORT": "x"}).adb.port


def test_env_is_read_at_load_time(monkeypatch):
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", "5041")
    monkeypatch.setenv("XDG_STATE_HOME", "/xdg-state")
    c = Config.default()
    assert c.adb.port == 5041
    assert c.debugger.state_file == Path("/xdg-state/ddmd/ports.json")
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", "5042")
    assert load_config(None).adb.port == 5042


def test_state_file_locations(tmp_path):
    assert parse({}, env={"HOME": "/h", "XDG_STATE_HOME": "/s"}).debugger.state_file == Path(
        "/s/ddmd/ports.json"
    )
    # A relative XDG_STATE_HOME is invalid by the XDG spec and ignored.
    assert parse({}, env={"HOME": "/h", "XDG_STATE_HOME": "rel"}).debugger.state_file == Path(
        "/h/.local/state/ddmd/ports.json"
    )
    explicit = {"debugger": {"state_file": "/var/lib/ddmd/ports.json"}}
    assert parse(explicit).debugger.state_file == Path("/var/lib/ddmd/ports.json")
    home = {"debugger": {"state_file": "~/ports.json"}}
    assert parse(home).debugger.state_file == Path("/home/user/ports.json")
    file = tmp_path / "c.toml"
    file.write_text('[debugger]\nstate_file = "state/ports.json"\n')
    assert load_config(file, env=ENV).debugger.state_file == tmp_path / "state" / "ports.json"


def test_find_config_file_order(tmp_path):
    explicit = tmp_path / "explicit.toml"
    from_env = tmp_path / "env.toml"
    xdg = tmp_path / "xdg"
    home = tmp_path / "home"
    for f in (explicit, from_env, xdg / "ddmd" / "config.toml", home / ".config/ddmd/config.toml"):
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("")
    env = {"DDMD_CONFIG": str(from_env), "XDG_CONFIG_HOME": str(xdg), "HOME": str(home)}
    assert find_config_file(str(explicit), env) == explicit
    assert find_config_file(None, env) == from_env
    del env["DDMD_CONFIG"]
    assert find_config_file(None, env) == xdg / "ddmd" / "config.toml"
    del env["XDG_CONFIG_HOME"]
    assert find_config_file(None, env) == home / ".config" / "ddmd" / "config.toml"
    assert find_config_file(None, {"HOME": str(tmp_path / "empty-home")}) is None
    assert find_config_file(None, {}) is None
    assert find_config_file(None, {"DDMD_CONFIG": ""}) is None


def test_find_config_file_explicit_must_exist(tmp_path):
    missing = str(tmp_path / "missing.toml")
    with pytest.raises(ConfigError) as info:
        find_config_file(missing, {})
    assert info.value.path == missing
    assert "--config" in str(info.value)
    with pytest.raises(ConfigError) as info:
        find_config_file(None, {"DDMD_CONFIG": missing})
    assert info.value.path == missing
    assert "$DDMD_CONFIG" in str(info.value)
    with pytest.raises(ConfigError, match="not a regular file"):
        find_config_file(str(tmp_path), {})


# --- fuzz

_FIELDS = section_fields(Config.default(env=ENV))
_ALL_KEYS = sorted({k for keys in _FIELDS.values() for k in keys})

_scalars = st.one_of(
    st.booleans(),
    st.integers(),
    st.integers(min_value=-1, max_value=70000),
    st.floats(),
    st.text(max_size=12),
    st.sampled_from(
        [
            "8000-8040",
            "8600-8699",
            "9000-8000",
            "auto",
            "on",
            "json",
            "debug",
            "127.0.0.1",
            "::",
            "",
        ]
    ),
    st.datetimes(),
    st.dates(),
    st.times(),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
_section = st.dictionaries(st.sampled_from(_ALL_KEYS) | st.text(max_size=10), _values, max_size=6)
_document = st.dictionaries(
    st.sampled_from(sorted(_FIELDS)) | st.text(max_size=8), _section | _values, max_size=5
)
_env = st.fixed_dictionaries(
    {"HOME": st.just("/home/user")},
    optional={
        "ANDROID_ADB_SERVER_PORT": st.text(max_size=6) | st.integers(-5, 70000).map(str),
        "XDG_STATE_HOME": st.text(max_size=10),
    },
)


@given(data=_document, env=_env)
def test_random_documents_only_raise_config_error(data, env):
    try:
        config = parse_config(data, source="fuzz.toml", env=env)
    except ConfigError as err:
        text = str(err)
        assert text.startswith("fuzz.toml: ")
        assert "\n" not in text
    else:
        assert isinstance(config, Config)


# --- every problem at once


MANY_PROBLEMS = (
    "[sacn]\n"
    '[scan]\nprots = "8000-8040"\ninterval = "fast"\n'
    '[debugger]\nports = "8690-8705"\nqueue_packets = 0\n'
    '[control]\nhost = "0.0.0.0"\n'
    '[log]\nlevel = "loud"\n'
)


def test_a_file_with_many_problems_reports_every_one(tmp_path):
    file = tmp_path / "many.toml"
    file.write_text(MANY_PROBLEMS)
    with pytest.raises(ConfigProblems) as info:
        load_config(file, env=ENV)
    err = info.value
    shown = [(p.key, str(p)) for p in err.problems]
    assert [key for key, _ in shown] == [
        "sacn",  # unknown section
        "scan.prots",  # unknown key
        "scan.interval",  # wrong type
        "debugger.queue_packets",  # out of range
        "control.host",  # not loopback without [security] allow_non_loopback
        "log.level",  # not one of the choices
        "debugger.current_port",  # across keys: inside the debugger port range
    ]
    for key, text in shown:
        assert text.startswith(f"{file}: {format_key(key)}"), text
        assert "\n" not in text
    texts = dict(shown)
    assert "did you mean 'scan'" in texts["sacn"]
    assert "[scan] prots = '8000-8040': unknown key; did you mean 'ports'" in texts["scan.prots"]
    assert "interval = 'fast': expected a number of seconds" in texts["scan.interval"]
    assert "queue_packets = 0: must be >= 1" in texts["debugger.queue_packets"]
    assert "host = '0.0.0.0': not a loopback address" in texts["control.host"]
    assert "allow_non_loopback = true" in texts["control.host"]
    assert "level = 'loud': must be one of" in texts["log.level"]
    assert (
        "current_port = 8700: inside [debugger] ports (8690-8705)" in texts["debugger.current_port"]
    )
    # Still a ConfigError, reading as the first problem plus a count, on one line.
    assert isinstance(err, ConfigError)
    assert (err.path, err.key) == (str(file), "sacn")
    assert str(err) == f"{err.problems[0]} (and 6 more problems)"


def test_a_single_problem_is_a_plain_config_error():
    with pytest.raises(ConfigError) as info:
        parse({"scan": {"ports": "9000-8000"}})
    assert type(info.value) is ConfigError
    assert info.value.problems == (info.value,)


@pytest.mark.parametrize(
    ("data", "key"),
    [
        # A key with a problem of its own is not used again by the checks across keys.
        ({"scan": {"interval": -1, "backoff_max": 1}}, "scan.interval"),
        ({"debugger": {"ports": "nope"}, "control": {"port": 8650}}, "debugger.ports"),
        (
            {"debugger": {"current_port": "x"}, "scan": {"ports": "8700-8705"}},
            "debugger.current_port",
        ),
        (
            {"security": {"allow_non_loopback": "yes"}, "control": {"host": "0.0.0.0"}},
            "security.allow_non_loopback",
        ),
        ({"scan": {"enabled": "no", "ports": "8600-8700"}}, "scan.enabled"),
        ({"debugger": 5, "control": {"port": 8711}}, "debugger"),
    ],
)
def test_one_mistake_is_reported_once(data, key):
    with pytest.raises(ConfigError) as info:
        parse(data)
    assert [p.key for p in info.value.problems] == [key]


def test_problems_in_different_sections_are_all_found():
    with pytest.raises(ConfigProblems) as info:
        parse(
            {
                "adb": {"enabled": "sometimes", "port": 0},
                "timeouts": {"connect": 0, "adb": "5"},
                "limits": {"max_vms": True},
                "scan": {"ports": "8700-8710"},  # includes current_port and control port
            }
        )
    assert [p.key for p in info.value.problems] == [
        "adb.enabled",
        "adb.port",
        "timeouts.connect",
        "timeouts.adb",
        "limits.max_vms",
        "scan.ports",
        "scan.ports",
    ]
    texts = [str(p) for p in info.value.problems]
    assert "includes [debugger] current_port (8700)" in texts[-2]
    assert "includes [control] port (8710)" in texts[-1]


# --- [front]: ddmd's adb front (issue 18)


def test_front_defaults():
    front = Config.default(env=ENV).front
    assert front.enabled is True
    assert (front.host, front.port) == ("127.0.0.1", 5038)
    assert front.on_kill == "refuse"
    assert (front.open_timeout, front.request_timeout) == (5.0, 10.0)


def test_front_values_are_read():
    front = parse(
        {
            "front": {
                "enabled": False,
                "host": "::1",
                "port": 5037,
                "on_kill": "RELAY",
                "open_timeout": 1,
                "request_timeout": 2.5,
            },
            "adb": {"port": 5039},
        }
    ).front
    assert (front.enabled, front.host, front.port, front.on_kill) == (False, "::1", 5037, "relay")
    assert (front.open_timeout, front.request_timeout) == (1.0, 2.5)


@pytest.mark.parametrize(
    ("key", "value", "shown", "fragment"),
    [
        ("enabled", "yes", "'yes'", "expected true or false"),
        ("port", 0, "0", "port must be between 1 and 65535"),
        ("port", "5038", "'5038'", "expected a port number"),
        ("on_kill", "ignore", "'ignore'", "must be one of 'refuse', 'relay'"),
        ("on_kill", True, "true", "expected one of"),
        ("open_timeout", 0, "0", "positive"),
        ("request_timeout", -1, "-1", "positive"),
        ("request_timeout", "10", "'10'", "expected a number of seconds"),
        ("host", "", "''", "must not be empty"),
        ("host", "not a host", "'not a host'", "not an IP address or host name"),
    ],
)
def test_front_bad_values(key, value, shown, fragment):
    expect_error({"front": {key: value}}, f"front.{key}", shown, fragment)


def test_front_unknown_key_lists_its_keys():
    expect_error(
        {"front": {"prot": 1}},
        "front.prot",
        "1",
        "did you mean 'port'",
        "keys in [front]: enabled, host, port, on_kill, open_timeout, request_timeout",
    )


def test_front_non_loopback_host_needs_permission():
    expect_error({"front": {"host": "0.0.0.0"}}, "front.host", "'0.0.0.0'", "allow_non_loopback")
    config = parse({"front": {"host": "0.0.0.0"}, "security": {"allow_non_loopback": True}})
    assert config.front.host == "0.0.0.0"


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"front": {"port": 8650}}, "inside [debugger] ports (8600-8699)"),
        ({"front": {"port": 8700}}, "same as [debugger] current_port"),
        ({"front": {"port": 8710}}, "same as [control] port"),
        ({"front": {"port": 8005}}, "inside [scan] ports (8000-8040)"),
        ({"front": {"port": 5037}}, "same as [adb] port: the front would relay to itself"),
        ({"adb": {"port": 5038}}, "same as [adb] port"),
    ],
)
def test_front_port_clashes(data, fragment):
    if "adb" not in data:
        data = {**data, "adb": {"port": 5037}}
    expect_error(data, "front.port", None, fragment)


def test_front_port_clashes_are_ignored_when_the_front_is_off():
    config = parse({"front": {"enabled": False, "port": 8700}})
    assert config.front.port == 8700


def test_front_on_adb_port_is_fine_when_adb_is_moved_or_remote():
    assert parse({"front": {"port": 5037}, "adb": {"port": 5039}}).front.port == 5037
    remote = parse({"front": {"port": 5037}, "adb": {"port": 5037, "host": "10.0.0.2"}})
    assert remote.front.port == 5037
    # scan disabled: its range no longer matters
    assert parse({"front": {"port": 8005}, "scan": {"enabled": False}}).front.port == 8005


def test_front_port_equal_to_an_env_adb_port_is_left_to_the_front():
    # ANDROID_ADB_SERVER_PORT=5038 must not stop ddmd from starting: the front itself refuses
    # that port at run time (with a warning) instead.
    config = parse({}, env={**ENV, "ANDROID_ADB_SERVER_PORT": "5038"})
    assert (config.adb.port, config.front.port) == (5038, 5038)


def test_front_one_mistake_is_reported_once():
    with pytest.raises(ConfigError) as info:
        parse({"front": {"port": "x"}, "debugger": {"current_port": 5038}})
    assert [p.key for p in info.value.problems] == ["front.port"]


def test_relay_spin_is_sixty_microseconds_by_default_and_bounded():
    assert parse_config({}, source="test", env=ENV).debugger.relay_spin_us == 60
    c = parse_config({"debugger": {"relay_spin_us": 0}}, source="test", env=ENV)
    assert c.debugger.relay_spin_us == 0  # the thread always sleeps
    for value in (-1, 1001):
        expect_error(
            {"debugger": {"relay_spin_us": value}},
            "debugger.relay_spin_us",
            str(value),
            "between 0 and 1000",
        )
