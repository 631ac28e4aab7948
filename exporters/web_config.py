"""Web-config files for the exporter, in the format of Prometheus' exporter-toolkit.

Operators already write these files for node_exporter and friends, so we read the same key
names instead of inventing our own. Only the subset we actually enforce is accepted: a key we
would silently ignore (say `cipher_suites`) could leave someone believing a protection is on
when it is not, so anything unknown is an error naming the file and the key.

JSON is always understood; YAML (the toolkit's native format) only when PyYAML is importable,
because we do not want a YAML parser as a hard dependency of the exporter.
"""

from __future__ import annotations

import ipaddress
import json
import re
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import bcrypt

from dspark_obs.json_files import check_nesting

__all__ = [
    "MAX_BCRYPT_COST",
    "TLSServerConfig",
    "WebConfig",
    "certificate_problems",
    "hash_password",
    "load_web_config",
]

# Modular-crypt bcrypt: $2a$/$2b$/$2y$, two-digit cost, 22 salt + 31 hash chars.
_BCRYPT_RE = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_TOP_KEYS = ("tls_server_config", "basic_auth_users")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version")
_CLIENT_AUTH = ("NoClientCert", "RequireAndVerifyClientCert")
_MIN_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# bcrypt only looks at the first 72 bytes; silently truncating would accept wrong passwords.
_BCRYPT_MAX_BYTES = 72
#: The dearest bcrypt cost accepted. Each step doubles a check: cost 14 is about a second of
#: one core, cost 31 (which Go's bcrypt, and so exporter-toolkit, still accepts) days. Every
#: check of an unknown password pays it, so a dearer hash is a way to pin the CPU.
MAX_BCRYPT_COST = 14


def hash_password(plain: str, rounds: int = 12) -> str:
    """Hash a password for `basic_auth_users`; the default cost matches common bcrypt tooling."""
    raw = plain.encode("utf-8")
    if not raw:
        raise ValueError("password must not be empty")
    if len(raw) > _BCRYPT_MAX_BYTES:
        raise ValueError(f"password is {len(raw)} bytes; bcrypt uses at most 72")
    return bcrypt.hashpw(raw, bcrypt.gensalt(rounds=rounds)).decode("ascii")


@dataclass(frozen=True)
class TLSServerConfig:
    """TLS settings, with paths already resolved so the server never depends on its cwd."""

    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"

    @property
    def requires_client_cert(self) -> bool:
        return self.client_auth_type == "RequireAndVerifyClientCert"

    def ssl_context(self) -> ssl.SSLContext:
        """Build a fresh server context; raises ValueError so bad PEM fails at startup, not
        at the first scrape."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _MIN_VERSIONS[self.min_version]
        try:
            # A password callback that refuses: without it OpenSSL would prompt on the tty
            # for an encrypted key and hang a headless exporter.
            ctx.load_cert_chain(self.cert_file, self.key_file, password=_refuse_password)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ValueError(
                f"tls_server_config.cert_file/key_file: cannot load {self.cert_file} with "
                f"{self.key_file}: {exc}"
            ) from None
        if self.requires_client_cert:
            try:
                ctx.load_verify_locations(cafile=self.client_ca_file)
            except (ssl.SSLError, OSError) as exc:
                raise ValueError(
                    f"tls_server_config.client_ca_file: cannot load {self.client_ca_file}: {exc}"
                ) from None
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


@dataclass(frozen=True)
class WebConfig:
    """A validated web config; immutable so a running server cannot drift from what was
    checked."""

    tls: TLSServerConfig | None = None
    basic_auth_users: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    source: Path | None = None


def _refuse_password() -> bytes:
    raise ValueError("encrypted private keys are not supported; store the key unencrypted")


def load_web_config(path: str | Path) -> WebConfig:
    """Read and validate a web-config file; every error names the file and the key."""
    path = Path(path).expanduser().resolve()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read web config: {exc.strerror or exc}") from None
    data = _parse(path, text)
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    _reject_unknown(path, "", data, _TOP_KEYS)
    if "tls_server_config" in data and not data["tls_server_config"]:
        # a key meant to turn TLS on must not leave the endpoint on plain HTTP
        raise ValueError(
            f"{path}: tls_server_config is empty, so /metrics would be served over plain "
            "HTTP; give cert_file and key_file, or remove the key to serve without TLS"
        )
    tls_raw = data.get("tls_server_config")
    tls = None if tls_raw is None else _parse_tls(path, tls_raw)
    users = _parse_users(path, data.get("basic_auth_users"))
    if "basic_auth_users" in data and not users:
        # a key meant to turn authentication on must not leave the endpoint open
        raise ValueError(
            f"{path}: basic_auth_users names no user, so /metrics would be served without "
            "authentication; add a user, or remove the key to serve without basic auth"
        )
    if tls is not None:
        try:
            tls.ssl_context()
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
    return WebConfig(tls=tls, basic_auth_users=MappingProxyType(users), source=path)


def _parse(path: Path, text: str) -> Any:
    if not text.strip():
        return {}  # exporter-toolkit treats an empty file as "no TLS, no auth"
    try:  # JSON, or YAML's flow style, nested past any real config: refused, not recursed into
        check_nesting(text.encode("utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _RepeatedKey as exc:
        raise ValueError(f"{path}: key {exc} given twice; say it once") from None
    except json.JSONDecodeError as json_exc:
        try:
            import yaml  # optional: only needed for files that are not JSON
        except ImportError:
            raise ValueError(
                f"{path}: not valid JSON ({json_exc}); YAML web configs need PyYAML, which is "
                "not installed (pip install pyyaml, or write the file as JSON)"
            ) from None
        try:
            loader = _unique_key_loader(yaml)(text)  # a SafeLoader: plain data only
            try:
                loaded = loader.get_single_data()
            finally:
                loader.dispose()
        except _RepeatedKey as exc:
            raise ValueError(f"{path}: key {exc} given twice; say it once") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not valid YAML: {exc}") from None
        except RecursionError:  # block-style nesting, which brackets do not show
            raise ValueError(f"{path}: YAML nested too deeply") from None
        return {} if loaded is None else loaded


class _RepeatedKey(ValueError):
    """A mapping names one key twice: JSON and YAML readers keep the last silently, which
    lets a later `tls_server_config:` (even an empty one) undo an earlier one."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(repr(key))
        out[key] = value
    return out


def _unique_key_loader(yaml):
    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
            seen = set()
            for key in keys:
                if isinstance(key, (str, int, float, bool)) or key is None:
                    if key in seen:
                        raise _RepeatedKey(repr(key))
                    seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return Loader


def _reject_unknown(path: Path, where: str, data: Mapping, allowed: tuple[str, ...]) -> None:
    for key in data:
        if key not in allowed:
            raise ValueError(f"{path}: unknown key {where}{key!r}; allowed: {', '.join(allowed)}")


def _parse_tls(path: Path, raw: Any) -> TLSServerConfig:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: tls_server_config must be a mapping")
    _reject_unknown(path, "in tls_server_config: ", raw, _TLS_KEYS)
    for key in raw:
        if not isinstance(raw[key], str) or not raw[key]:
            raise ValueError(f"{path}: tls_server_config.{key} must be a non-empty string")
    cert = _existing_file(path, "cert_file", raw.get("cert_file"))
    key = _existing_file(path, "key_file", raw.get("key_file"))
    auth = raw.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise ValueError(
            f"{path}: tls_server_config.client_auth_type {auth!r} is not supported; "
            f"use one of {', '.join(_CLIENT_AUTH)}"
        )
    ca = raw.get("client_ca_file")
    if auth == "RequireAndVerifyClientCert" and ca is None:
        raise ValueError(
            f"{path}: tls_server_config.client_ca_file is required when client_auth_type "
            "is RequireAndVerifyClientCert"
        )
    if auth == "NoClientCert" and ca is not None:
        # Setting a CA but forgetting client_auth_type would look like mTLS while
        # accepting any client; refuse rather than guess.
        raise ValueError(
            f"{path}: tls_server_config.client_ca_file is set but client_auth_type is "
            "NoClientCert; set client_auth_type: RequireAndVerifyClientCert"
        )
    min_version = raw.get("min_version", "TLS12")
    if min_version not in _MIN_VERSIONS:
        raise ValueError(
            f"{path}: tls_server_config.min_version {min_version!r} is not supported; "
            f"use one of {', '.join(_MIN_VERSIONS)}"
        )
    return TLSServerConfig(
        cert_file=cert,
        key_file=key,
        client_auth_type=auth,
        client_ca_file=None if ca is None else _existing_file(path, "client_ca_file", ca),
        min_version=min_version,
    )


def _existing_file(path: Path, key: str, value: str | None) -> Path:
    if value is None:
        raise ValueError(f"{path}: tls_server_config.{key} is required")
    resolved = (path.parent / Path(value).expanduser()).resolve()
    if not resolved.is_file():
        raise ValueError(f"{path}: tls_server_config.{key}: file not found: {resolved}")
    return resolved


def _parse_users(path: Path, raw: Any) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValueError(f"{path}: basic_auth_users must be a mapping of user to bcrypt hash")
    users: dict[str, str] = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            # Basic auth splits "user:password" at the first colon.
            raise ValueError(
                f"{path}: basic_auth_users: user {user!r} must be a non-empty string without ':'"
            )
        if not isinstance(hashed, str) or not _BCRYPT_RE.match(hashed):
            raise ValueError(
                f"{path}: basic_auth_users.{user}: not a bcrypt hash ($2a$/$2b$/$2y$); "
                "generate one with dspark_obs.exporters.web_config.hash_password"
            )
        cost = int(hashed[4:6])
        if cost > MAX_BCRYPT_COST:
            raise ValueError(
                f"{path}: basic_auth_users.{user}: bcrypt cost {cost} is over "
                f"{MAX_BCRYPT_COST}, the most this exporter checks (each check doubles in "
                f"time per step: cost {cost} takes about {2 ** (cost - 14):,} s of a core); "
                "hash the password again with a lower cost"
            )
        users[user] = hashed
    return users


def certificate_problems(cert_file: Path, host: str, now: float | None = None) -> list[str]:
    """What a client will refuse in the server's certificate: expired, not yet valid, or not
    naming the host it is served on (checked where `host` is an address or name, not a
    wildcard). exporter-toolkit starts with each of these without a word; the exporter
    starts too (an operator may be mid-rotation) and says each in a warning.

    The certificate is read by the standard library's own decoder (`_test_decode_cert`,
    what `ssl`'s tests use), so no X.509 package is needed at run time."""
    try:
        cert = ssl._ssl._test_decode_cert(str(cert_file))  # type: ignore[attr-defined]
    except (OSError, ssl.SSLError, ValueError) as exc:
        return [f"cannot read the certificate to check its dates and names: {exc}"]
    now = time.time() if now is None else now
    problems = []
    after, before = cert.get("notAfter"), cert.get("notBefore")
    if after and ssl.cert_time_to_seconds(after) < now:
        problems.append(f"the certificate expired on {after}")
    if before and ssl.cert_time_to_seconds(before) > now:
        problems.append(f"the certificate is not valid until {before}")
    wildcard = host in ("", "0.0.0.0", "::")  # nosec B104: the names checked, not a bind
    if not wildcard and not _names_host(cert, host):
        problems.append(
            f"the certificate does not name {host!r}, the host it is served on: clients "
            "that check the name will refuse it"
        )
    return problems


def _names_host(cert: dict, host: str) -> bool:
    sans = cert.get("subjectAltName", ())
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        ip = None
    if ip is not None:
        return any(
            kind == "IP Address" and ipaddress.ip_address(value.strip()) == ip
            for kind, value in sans
        )
    names = [value for kind, value in sans if kind == "DNS"]
    if not sans:  # no SAN: clients of today ignore the common name, but it is all there is
        names = [v for rdn in cert.get("subject", ()) for k, v in rdn if k == "commonName"]
    host = host.lower().rstrip(".")
    for name in names:
        name = name.lower().rstrip(".")
        if name == host or (
            name.startswith("*.") and "." in host and host.split(".", 1)[1] == name[2:]
        ):
            return True
    return False
