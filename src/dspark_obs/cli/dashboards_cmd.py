"""`dspark-obs dashboards`: export the Grafana dashboard for provisioning, or push it over HTTP.

`export DIR` writes DIR/dspark.json, DIR/dspark-fleet.json,
DIR/provisioning/{dashboards,datasources}.yml and the Prometheus rules DIR/rules/*.yml, every
query with `--selector` in it.
`push` uploads the dashboard through Grafana's dashboard API (`dashboards.push`); the token
comes from --token-file or $GRAFANA_TOKEN, never from the command line.
`render` draws every panel from a Prometheus' data with matplotlib: DIR/NN-<slug>.png per
panel, DIR/overview.png and an offline DIR/index.html.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..secret_text import check_secret
from .errors import CliError

# the name of the environment variable holding the token, not a token
TOKEN_ENV = "GRAFANA_TOKEN"  # nosec B105


def _export(args: argparse.Namespace) -> int:
    from ..dashboards import write_tree

    out = Path(args.dir)
    if out.exists() and not out.is_dir():
        raise CliError(f"{out} exists and is not a directory")
    for path in write_tree(out, selector=args.selector, sglang_selector=args.sglang_selector,
                           runbook_base=args.runbook_url_base):  # fmt: skip
        print(path)
    return 0


def _token(args: argparse.Namespace) -> str:
    if args.token_file:
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not UTF-8 text"
            raise CliError(f"cannot read --token-file {args.token_file}: {reason}") from None
        if not token:
            raise CliError(f"--token-file {args.token_file} is empty")
        where = f"--token-file {args.token_file}"
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise CliError(f"no Grafana token: pass --token-file FILE or set ${TOKEN_ENV}")
        where = f"${TOKEN_ENV}"
    try:
        return check_secret(token, where)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _push(args: argparse.Namespace) -> int:
    from ..dashboards.push import push_dashboard

    print(
        push_dashboard(
            args.grafana_url,
            lambda: _token(args),
            folder=args.folder,
            timeout=args.timeout,
            dashboard=args.dashboard,
        )
    )
    return 0


def _render(args: argparse.Namespace) -> int:
    from ..dashboards.drawing import QUERY_VARIABLES, RenderError, parse_duration, render
    from ..dashboards.provisioning import shipped_dashboard

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CliError(f"{out} exists and is not a directory")
    for name, value in (("--range", args.range), ("--step", args.step)):
        try:
            parse_duration(value)
        except ValueError as exc:
            raise CliError(f"{name}: {exc}") from None
    variables: dict[str, str] = {}
    for item in args.var:
        name, sep, value = item.partition("=")
        name = name.strip().lstrip("$")
        if not sep or name not in QUERY_VARIABLES:
            raise CliError(
                f"--var {item!r}: expected NAME=REGEX with NAME one of {', '.join(QUERY_VARIABLES)}"
            )
        variables[name] = value
    try:
        result = render(
            args.prometheus,
            out,
            range_=args.range,
            step=args.step,
            variables=variables,
            timeout=args.timeout,
            dashboard=shipped_dashboard(args.dashboard),
        )
    except RenderError as exc:
        raise CliError(str(exc)) from None
    empty = 0
    for data, path in result.panels:
        empty += not data.has_data
        print(f"{path}{'' if data.has_data else '  (no data)'}")
    print(result.overview)
    print(result.index)
    print(f"rendered {len(result.panels)} panels ({len(result.panels) - empty} with data) to {out}")
    return 0


def _dashboard_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dashboard",
        choices=("main", "fleet"),
        default="main",
        help="main: one exporter's view (dspark.json); fleet: fleet, per-node and per-rank "
        "views from summed counters (dspark-fleet.json) (default main)",
    )


def configure(p: argparse.ArgumentParser) -> None:
    p.description = "The Grafana dashboards for the exporter's metrics (docs/dashboards.md)."
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    e = actions.add_parser(
        "export",
        help="write the dashboards, their provisioning YAML and the Prometheus rules into DIR",
        description="Write DIR/dspark.json, DIR/dspark-fleet.json and "
        "DIR/provisioning/{dashboards,datasources}.yml for Grafana file provisioning, and the "
        "recording and alert rules DIR/rules/{recording,fleet,alerts}.yml for Prometheus.",
    )
    e.add_argument("dir", metavar="DIR")
    e.add_argument(
        "--selector",
        default="",
        metavar="MATCHERS",
        help='label matchers every query of the exporters\' series gets, e.g. job="dspark-prod" '
        '(replaces the alerts\' job=~"dspark.*" on up; default: none)',
    )
    e.add_argument(
        "--sglang-selector",
        default="",
        metavar="MATCHERS",
        help="label matchers for SGLang's own gauges in the cross-check (default: none)",
    )
    e.add_argument(
        "--runbook-url-base",
        default=None,
        metavar="URL",
        help="where docs/runbooks.md is published: the alerts' runbook_url point there",
    )
    e.set_defaults(handler=_export)
    u = actions.add_parser(
        "push",
        help="upload the dashboard to Grafana (POST /api/dashboards/db, overwrite)",
        description="Upload the dashboard with a service-account token from --token-file or "
        f"${TOKEN_ENV}.",
    )
    u.add_argument("--grafana-url", required=True, metavar="URL", help="e.g. http://grafana:3000")
    u.add_argument("--token-file", metavar="F", help=f"file holding the token (else ${TOKEN_ENV})")
    u.add_argument("--folder", metavar="NAME", help="folder title; created when missing")
    u.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds")
    _dashboard_argument(u)
    u.set_defaults(handler=_push)
    r = actions.add_parser(
        "render",
        help="draw every panel from Prometheus data to PNGs and an offline index.html",
        description="Run every panel's queries through Prometheus' /api/v1/query_range over "
        "the last RANGE and draw them with matplotlib: DIR/NN-<slug>.png per panel, "
        "DIR/overview.png and DIR/index.html (PNGs embedded, opens offline).",
    )
    r.add_argument("--prometheus", required=True, metavar="URL", help="e.g. http://prom:9090")
    r.add_argument("--out", required=True, metavar="DIR", help="output directory")
    r.add_argument("--range", default="15m", metavar="D", help="time range back from now (15m)")
    r.add_argument("--step", default="15s", metavar="D", help="query resolution (15s)")
    r.add_argument(
        "--var",
        action="append",
        default=[],
        metavar="NAME=REGEX",
        help="template variable (workload, rank, mode, instance, cluster; default .*); repeatable",
    )
    r.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds")
    _dashboard_argument(r)
    r.set_defaults(handler=_render)
