"""``hms-cache-proxy``: the command line.

Every option of :mod:`proxy.config` becomes a flag; flags left out fall back to the
environment, then to the ``--config`` TOML file, then to the default.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from proxy import __version__
from proxy.config import ENV_PREFIX, ConfigError, Options, flag_name, load, option_fields


def _toml_value(value: object) -> str:
    if value is None:
        return '""'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    escaped = str(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hms-cache-proxy",
        description="A caching proxy for the Hive Metastore's Thrift API.",
    )
    parser.add_argument("--version", action="version", version=f"hms-cache-proxy {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy. Every option can also be set as an environment variable "
        f"{ENV_PREFIX}<OPTION> or as a key in the --config TOML file "
        "(flag > environment > file > default).",
    )
    serve.add_argument("--config", type=Path, help="TOML file with options (keys as below, with _)")
    serve.add_argument(
        "--print-config", action="store_true", help="print the effective configuration and exit"
    )
    defaults = Options().printable()
    for f in option_fields():
        default = defaults[f.name] if defaults[f.name] not in (None, "") else "none"
        switch = f.metadata["metavar"] == "on|off"  # a bare --flag means on
        serve.add_argument(
            flag_name(f.name),
            dest=f.name,
            metavar=f.metadata["metavar"] or None,
            help=f"{f.metadata['help']} (default: {default})",
            nargs="?" if switch else None,
            const="on" if switch else None,
        )
    from proxy.admin import cli as admin_cli
    from proxy.listing import cli as listing_cli

    admin_cli.add_commands(commands)
    listing_cli.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    from proxy.admin import cli as admin_cli
    from proxy.listing import cli as listing_cli

    try:
        if args.command in listing_cli.COMMANDS:
            return listing_cli.run(args)
        return admin_cli.run(args)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as other command-line tools do, and
        # keep Python from reporting the same error again when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _serve(args: argparse.Namespace) -> int:
    flags = {f.name: getattr(args, f.name) for f in option_fields()}
    config_file = args.config
    if config_file is None and os.environ.get(ENV_PREFIX + "CONFIG"):
        config_file = Path(os.environ[ENV_PREFIX + "CONFIG"])
    try:
        options = load(flags, os.environ, config_file, require_upstream=not args.print_config)
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"hms-cache-proxy: configuration: {problem}", file=sys.stderr)
        return 2
    from proxy import loop

    try:
        loop_name, loop_factory = loop.factory(options.event_loop)
    except RuntimeError as exc:
        print(f"hms-cache-proxy: configuration: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        for key, value in options.printable().items():
            print(f"{key} = {_toml_value(value)}")
        print(f"# event loop that runs: {loop_name}")
        return 0
    logging.basicConfig(
        level=options.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from proxy.sasl.layer import SaslError

    logging.getLogger("proxy").info("event loop: %s", loop_name)
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_run(options))
    except (OSError, SaslError) as exc:  # a port in use, typically; or a bad keytab
        print(f"hms-cache-proxy: cannot start: {exc}", file=sys.stderr)
        return 1


async def _run(options: Options) -> int:
    from proxy.app import serve

    return await serve(options)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
