"""Options: one table, three spellings, flag > environment > file > default."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from proxy import cli
from proxy.config import ConfigError, Endpoint, HostPort, load, redact_url
from proxy.wire.framing import Transport

UP = {"upstream": "thrift://hms:9083"}


def test_defaults_are_what_engines_expect() -> None:
    options = load(UP, {})
    assert options.listen == HostPort("0.0.0.0", 9083)
    assert options.metrics_listen == HostPort("0.0.0.0", 9090)
    assert options.client_transport is Transport.BUFFERED
    assert options.upstream_transport is Transport.BUFFERED
    # The proxy never gives up on a call before its client would: Hive's and Spark's client
    # wait 600 s (Trino's 10 s ends its reads itself, and the proxy drops them then).
    assert options.upstream_read_timeout >= 600
    # A fence lasts at least as long as Hive's lock timeout (hive.txn.timeout, 300 s).
    assert options.lock_fence_seconds >= 300
    # A reply is never bigger than a Thrift 0.14+ client takes (TConfiguration's 100 MiB).
    assert options.max_reply_bytes == 100 << 20
    # Protections a platform team turns on by choice are off; the heavy line is on.
    assert options.max_partitions_per_call == 0
    assert options.heavy_partitions > 0 and options.heavy_max_concurrent > 0


def test_upstream_is_a_comma_list_in_order() -> None:
    options = load({"upstream": "thrift://a:9083, thrift://b.example:19083"}, {})
    assert options.upstream == (Endpoint("a", 9083), Endpoint("b.example", 19083))


def test_precedence_flag_env_file_default(tmp_path: Path) -> None:
    file = tmp_path / "proxy.toml"
    file.write_text(
        'upstream = "thrift://file:1"\nupstream_read_timeout = 3.5\nlisten = "127.0.0.1:7000"\n'
    )
    env = {
        "HMS_CACHE_PROXY_UPSTREAM": "thrift://env:2",
        "HMS_CACHE_PROXY_UPSTREAM_READ_TIMEOUT": "4",
    }
    options = load({"upstream": "thrift://flag:3"}, env, file)
    assert options.upstream == (Endpoint("flag", 3),)
    assert options.upstream_read_timeout == 4.0  # env beats file
    assert options.listen == HostPort("127.0.0.1", 7000)  # file beats default
    assert options.upstream_connect_timeout == 2.0  # default


def test_every_problem_is_reported_once_with_its_source(tmp_path: Path) -> None:
    file = tmp_path / "bad.toml"
    file.write_text('colour = "blue"\nmax_reply_bytes = "lots"\n')
    env = {"HMS_CACHE_PROXY_LISTEN": "nowhere", "HMS_CACHE_PROXY_TYPO": "1"}
    with pytest.raises(ConfigError) as err:
        load({"upstream": "http://hms:9083", "client_transport": "udp"}, env, file)
    problems = err.value.problems
    assert len(problems) == 6
    assert any(p.startswith("--upstream:") and "thrift://" in p for p in problems)
    assert any(p.startswith("--client-transport:") for p in problems)
    assert any(p.startswith("HMS_CACHE_PROXY_LISTEN:") for p in problems)
    assert any("HMS_CACHE_PROXY_TYPO" in p for p in problems)
    assert any("unknown option 'colour'" in p for p in problems)
    assert any("config file key 'max_reply_bytes'" in p for p in problems)


def test_missing_upstream_is_a_problem() -> None:
    with pytest.raises(ConfigError, match="no metastore given"):
        load({}, {})


@pytest.mark.parametrize(
    ("text", "value"), [("64MiB", 64 << 20), ("512k", 512 << 10), ("1G", 1 << 30), ("1000", 1000)]
)
def test_sizes(text: str, value: int) -> None:
    assert load({**UP, "max_request_bytes": text}, {}).max_request_bytes == value


def test_redis_password_is_redacted() -> None:
    assert redact_url("redis://user:s3cret@r:6379/0") == "redis://user:***@r:6379/0"
    assert redact_url("rediss://:s3cret@r:6380") == "rediss://:***@r:6380"
    assert redact_url("unix:///run/redis.sock") == "unix:///run/redis.sock"


def test_print_config_redacts_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        [
            "serve",
            "--print-config",
            "--redis",
            "redis://u:hunter2@r:6379/0",
            "--upstream",
            "thrift://h:1",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "hunter2" not in out and 'redis = "redis://u:***@r:6379/0"' in out
    assert 'upstream = "thrift://h:1"' in out


def test_bad_configuration_exits_2_with_one_line_per_problem(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(
        ["serve", "--upstream", "thrift://h:1", "--listen", "x", "--drain-timeout", "-1"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 2 and all(
        line.startswith("hms-cache-proxy: configuration: ") for line in err
    )


def test_tls_files_come_in_pairs_and_must_be_readable(tmp_path: Path) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("x")
    with pytest.raises(ConfigError) as err:
        load(
            {
                **UP,
                "tls_cert": str(cert),
                "upstream_tls_ca": str(tmp_path / "missing.pem"),
            },
            {},
        )
    problems = err.value.problems
    assert any(p.startswith("tls_cert, tls_key: give both") for p in problems)
    assert any("upstream_tls_ca: cannot read" in p for p in problems)
    assert any("set upstream_tls on" in p for p in problems)
    with pytest.raises(ConfigError, match="tls_client_ca: needs tls_cert"):
        load({**UP, "tls_client_ca": str(cert)}, {})


def test_on_off_options_are_switches() -> None:
    parsed = cli.build_parser().parse_args(["serve", "--status-show-names", "--cache", "off"])
    assert (parsed.status_show_names, parsed.cache) == ("on", "off")


def test_kubernetes_service_links_are_not_mistaken_for_options() -> None:
    env = {
        "HMS_CACHE_PROXY_SERVICE_HOST": "10.0.0.7",
        "HMS_CACHE_PROXY_SERVICE_PORT": "9083",
        "HMS_CACHE_PROXY_SERVICE_PORT_THRIFT": "9083",
        "HMS_CACHE_PROXY_PORT": "tcp://10.0.0.7:9083",
        "HMS_CACHE_PROXY_PORT_9083_TCP": "tcp://10.0.0.7:9083",
        "HMS_CACHE_PROXY_PORT_9083_TCP_ADDR": "10.0.0.7",
        "HMS_CACHE_PROXY_PORT_9083_TCP_PROTO": "tcp",
    }
    assert load(UP, env).listen.port == 9083
    with pytest.raises(ConfigError, match="HMS_CACHE_PROXY_PORTS: unknown option"):
        load(UP, {"HMS_CACHE_PROXY_PORTS": "1"})


def test_listen_addresses_that_share_a_port_collide() -> None:
    from proxy.config import collide

    assert collide(HostPort("0.0.0.0", 9090), HostPort("127.0.0.1", 9090))
    assert collide(HostPort("127.0.0.1", 9090), HostPort("127.0.0.1", 9090))
    assert collide(HostPort("::", 9090), HostPort("10.0.0.1", 9090))
    assert not collide(HostPort("127.0.0.1", 9090), HostPort("127.0.0.2", 9090))
    assert not collide(HostPort("0.0.0.0", 9090), HostPort("0.0.0.0", 9091))
    with pytest.raises(ConfigError, match="same port"):
        load({**UP, "metrics_listen": "0.0.0.0:9191", "admin_listen": "127.0.0.1:9191"}, {})


def test_an_unreadable_config_file_is_its_only_problem(tmp_path: Path) -> None:
    broken = tmp_path / "proxy.toml"
    broken.write_text("upstream = \n")
    with pytest.raises(ConfigError) as err:
        load({}, {}, broken)
    assert len(err.value.problems) == 1 and "not valid TOML" in err.value.problems[0]
    with pytest.raises(ConfigError) as err:
        load({}, {}, tmp_path / "missing.toml")
    assert len(err.value.problems) == 1


def test_a_command_piped_into_a_reader_that_stops_ends_quietly() -> None:
    """``hms-cache-proxy ls ... | head -1``: no BrokenPipeError traceback, status 141."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from proxy import cli\n"
        "from proxy.listing import cli as listing\n"
        "def run(args):\n"
        "    for i in range(1_000_000):\n"
        "        print('a listing line', i)\n"
        "    return 0\n"
        "listing.run = run\n"
        "sys.exit(cli.main(['ls', 'db.t', '--partition', 'ds=1']))\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b"a listing line")
    proc.stdout.close()  # the reader stops, as head does
    err = proc.stderr.read()
    proc.stderr.close()
    assert proc.wait(60) == 141, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err


@pytest.mark.parametrize(
    ("values", "warned"),
    [
        ({"lock_fence_seconds": "60"}, True),
        ({"lock_fence_seconds": "299"}, True),
        ({"lock_fence_seconds": "300"}, False),  # the default
        ({"lock_fence_seconds": "0"}, False),  # no fences: its help says unsafe
        ({"lock_fence_seconds": "60", "cache": "off"}, False),  # no cache, nothing to fence
    ],
)
def test_a_lock_fence_shorter_than_hive_txn_timeout_is_warned_about_once_at_start_up(
    values: dict[str, str], warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from proxy.app import Proxy

    with caplog.at_level(logging.WARNING, logger="proxy"):
        Proxy.build(load({**UP, **values}, {}))
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "lock_fence_seconds" in r.getMessage()
    ]
    assert len(lines) == (1 if warned else 0), lines
    if warned:
        assert "hive.txn.timeout" in lines[0] and "may end before" in lines[0]


def test_a_configuration_that_sets_the_gone_forward_at_once_still_loads(tmp_path: Path) -> None:
    file = tmp_path / "proxy.toml"
    file.write_text('upstream = "thrift://file:1"\nforward_at_once = "off"\n')
    options = load({}, {}, file)  # (an upgrade must not stop a proxy from starting)
    assert options.forward_at_once == "off" and options.fast_paths == "on"


def test_the_audit_log_and_the_reply_limit_are_checked_at_start(tmp_path: Path) -> None:
    base = {"upstream": "thrift://hms:9083"}
    assert load({**base, "audit_log": "-"}, {}).audit_log == "stdout"
    assert load({**base, "audit_log": "STDOUT"}, {}).audit_log == "stdout"
    assert load({**base, "audit_log": "off"}, {}).audit_log is None
    for bad, says in (
        ({"audit_log": str(tmp_path)}, "is a directory"),
        ({"audit_log": "/nonexistent/dir/audit.log"}, "cannot write in"),
        ({"max_reply_bytes": "10"}, "from 4 KiB"),
        ({"max_reply_bytes": "2GiB"}, "under 2 GiB"),
    ):
        with pytest.raises(ConfigError) as raised:
            load({**base, **bad}, {})
        assert says in str(raised.value)
