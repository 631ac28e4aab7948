"""`dspark-obs hash-password`: a bcrypt hash for `basic_auth_users` in a web-config file."""

from __future__ import annotations

import argparse
import getpass
import sys

from ..exporters.web_config import hash_password
from .errors import CliError


def handle(args: argparse.Namespace) -> int:
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise CliError("the two passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise CliError("empty password")
    print(hash_password(password, rounds=args.rounds))
    return 0


def configure(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Read a password (prompted on a terminal, else the first line of stdin) and "
        "print its bcrypt hash; the password itself is never printed or logged."
    )
    p.add_argument("--rounds", type=int, default=12, help="bcrypt cost factor (default 12)")
    p.set_defaults(handler=handle)
