"""Audit the installed packages for known vulnerabilities with pip-audit.

pip-audit asks an advisory service on the network (PyPI's JSON API by
default). CI machines reach the package index but not necessarily that
service, so this wrapper tells three outcomes apart:

- a vulnerability is found: exit 1, listing each one (never tolerated);
- the service could not be reached, or answered for none of the packages
  (a package mirror without PyPI's JSON API makes every package "not found"):
  exit 0 with a line saying that nothing was audited;
- anything else pip-audit fails on: its own output and exit status.

Usage: python tools/audit.py  (audits the environment of that interpreter)
"""

from __future__ import annotations

import json
import subprocess  # nosec B404
import sys
import tempfile
from pathlib import Path

#: Exception names in pip-audit's traceback that mean "the network", not "a finding".
NETWORK_ERRORS = (
    "requests.exceptions.ConnectionError",
    "requests.exceptions.ProxyError",
    "requests.exceptions.ConnectTimeout",
    "requests.exceptions.ReadTimeout",
    "requests.exceptions.SSLError",
    "urllib3.exceptions.",
    "socket.gaierror",
    "NameResolutionError",
    "Max retries exceeded",
)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.json"
        cmd = [
            sys.executable,
            "-m",
            "pip_audit",
            "--local",
            "--progress-spinner",
            "off",
            "--format",
            "json",
            "--output",
            str(out),
        ]
        # a fixed argv of this interpreter's own module, no shell
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # nosec B603
        text = out.read_text() if out.is_file() else ""
    if not text:
        if any(marker in proc.stderr for marker in NETWORK_ERRORS):
            last = proc.stderr.strip().splitlines()[-1][:200]
            print(f"pip-audit: advisory service unreachable, nothing audited ({last})")
            return 0
        sys.stderr.write(proc.stderr)
        return proc.returncode or 1
    deps = json.loads(text)["dependencies"]
    vulnerable = [d for d in deps if d.get("vulns")]
    for dep in vulnerable:
        for vuln in dep["vulns"]:
            fixed = ", ".join(vuln.get("fix_versions") or []) or "no fix yet"
            print(f"pip-audit: {dep['name']} {dep['version']}: {vuln['id']} (fixed in {fixed})")
    if vulnerable:
        return 1
    audited = [d for d in deps if "skip_reason" not in d]
    if not audited:
        print(
            f"pip-audit: the advisory service knew none of the {len(deps)} installed packages "
            "(offline, or a mirror without PyPI's JSON API): nothing audited"
        )
        return 0
    skipped = len(deps) - len(audited)
    print(
        f"pip-audit: {len(audited)} packages audited, no known vulnerabilities"
        + (f" ({skipped} not on PyPI, skipped)" if skipped else "")
    )
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
