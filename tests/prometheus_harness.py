"""A real Prometheus server and promtool, driven from tests.

Our exporter's contract is "a stock Prometheus scrapes it and PromQL sees the right numbers".
Parsing our own output with prometheus_client's parser would only prove that the library agrees
with itself, so integration tests run Debian's `prometheus` binary (2.42, installed by
`tools/test.sh`) against loopback ports and ask it over its HTTP API what it ingested.

Deliberately free of pytest, so any test (or a script reproducing a CI failure by hand) can use
it; deliberately standard-library only for HTTP, so it adds nothing to the dependency set.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = [
    "PrometheusError",
    "PrometheusServer",
    "free_port",
    "prometheus_available",
    "promtool_check_metrics",
    "scrape_job",
]

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"
#: Seconds to wait for a condition (ready, up, a query's answer): generous, so that a loaded
#: machine only makes a test slower; every wait polls and returns once its condition holds.
WAIT = 180.0

# A loopback-only opener: urllib honours http_proxy/https_proxy from the environment, and a CI
# proxy would otherwise swallow requests meant for 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusError(RuntimeError):
    """The server refused a request or never became usable; the message carries its log tail."""


def prometheus_available() -> bool:
    """Both binaries are needed: the server for scraping, promtool for the exposition lint."""
    return shutil.which(PROMETHEUS) is not None and shutil.which(PROMTOOL) is not None


def require_prometheus(*, promtool_only: bool = False) -> None:
    """Called at a test module's top: skip the module without Debian's `prometheus` (or
    only `promtool`), but fail where CI is set, since tools/test.sh installs it there."""
    if (promtool_only and shutil.which(PROMTOOL) is not None) or prometheus_available():
        return
    what = "`promtool`" if promtool_only else "`prometheus`/`promtool`"
    msg = f"{what} not on PATH: install Debian's `prometheus` package (tools/test.sh does this)"
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but {msg}", pytrace=False)
    pytest.skip(msg, allow_module_level=True)


def free_port() -> int:
    """Ask the kernel, not a constant: parallel runs and a stray service on 9090 must not clash.

    There is a small window before the caller binds it; `PrometheusServer` retries on that.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def promtool_check_metrics(text: str | bytes) -> subprocess.CompletedProcess:
    """Lint an exposition the way upstream does, so naming mistakes fail here and not in review.

    promtool 2.42 exits 0 when clean, 3 for lint findings (e.g. a counter without `_total`,
    missing HELP) and 1 for text it cannot parse; findings are on stdout/stderr.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def scrape_job(
    name: str,
    targets: Sequence[str],
    *,
    scheme: str | None = None,
    tls_config: Mapping[str, Any] | None = None,
    basic_auth: Mapping[str, Any] | None = None,
    metrics_path: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Build one `scrape_configs` entry; keys are Prometheus's own, passed through untouched.

    Passing through rather than modelling the options keeps the harness honest: whatever
    Prometheus would reject (a bad tls_config, say) is rejected by Prometheus itself.
    """
    job: dict[str, Any] = {"job_name": name, "static_configs": [{"targets": list(targets)}]}
    if scheme is not None:
        job["scheme"] = scheme
    if metrics_path is not None:
        job["metrics_path"] = metrics_path
    if tls_config is not None:
        job["tls_config"] = dict(tls_config)
    if basic_auth is not None:
        job["basic_auth"] = dict(basic_auth)
    job.update(extra)
    return job


def _normalise_jobs(
    jobs: Mapping[str, Sequence[str]] | Mapping[str, Any] | Iterable[Mapping[str, Any]],
) -> list[dict[str, Any]]:
    if isinstance(jobs, Mapping):
        if "job_name" in jobs:  # a single scrape_job(...)
            return [dict(jobs)]
        # {"job": ["host:port", ...]}: the common plain-HTTP case without ceremony.
        return [scrape_job(name, targets) for name, targets in jobs.items()]
    return [dict(job) for job in jobs]


class PrometheusServer:
    """A throwaway Prometheus on a free loopback port, its config and TSDB in a temp dir.

    `jobs` is a `{job_name: [host:port, ...]}` mapping, one `scrape_job(...)` dict, or a list of
    them. The config is written as JSON, which is valid YAML, so no YAML library is needed.
    """

    def __init__(
        self,
        jobs: Mapping[str, Sequence[str]] | Mapping[str, Any] | Iterable[Mapping[str, Any]],
        *,
        scrape_interval: str = "1s",
        workdir: str | os.PathLike[str] | None = None,
        ready_timeout: float = WAIT,
        extra_args: Sequence[str] = (),
        external_labels: Mapping[str, str] | None = None,
        rule_files: Sequence[str | os.PathLike[str]] = (),
    ) -> None:
        self.jobs = _normalise_jobs(jobs)
        if not self.jobs:
            raise ValueError("PrometheusServer needs at least one scrape job")
        self.scrape_interval = scrape_interval
        self.ready_timeout = ready_timeout
        self.extra_args = list(extra_args)
        self.external_labels = dict(external_labels or {})
        self.rule_files = [str(Path(f).resolve()) for f in rule_files]
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.port: int | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_file: Any = None

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
                # how this server labels what others federate from it
                "external_labels": self.external_labels,
            },
            "scrape_configs": self.jobs,
        }
        if self.rule_files:
            config["rule_files"] = self.rule_files
        return config

    @property
    def config_path(self) -> Path:
        return self._dir / "prometheus.yml"

    @property
    def log_path(self) -> Path:
        return self._dir / "prometheus.log"

    @property
    def url(self) -> str:
        if self.port is None:
            raise PrometheusError("server not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def _dir(self) -> Path:
        if self.workdir is None:
            raise PrometheusError("server not started")
        return self.workdir

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if shutil.which(PROMETHEUS) is None:
            raise PrometheusError(
                "`prometheus` is not on PATH; tools/test.sh installs Debian's `prometheus` package"
            )
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="prom-harness-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(self.config, indent=2))
        # free_port() can lose a race with another process; a few fresh ports settle it.
        for attempt in range(3):
            self.port = free_port()
            self._spawn()
            try:
                self._wait_ready()
                return
            except PrometheusError:
                exited = self.proc is not None and self.proc.poll() is not None
                in_use = "address already in use" in self.log_tail().lower()
                self._terminate()
                if not (exited and in_use) or attempt == 2:
                    self._cleanup()
                    raise

    def _spawn(self) -> None:
        data = self._dir / "data"
        data.mkdir(exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # closed in _terminate
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
                *self.extra_args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            cwd=self._dir,
        )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        last = ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise PrometheusError(
                    f"prometheus exited with {self.proc.returncode} before becoming ready"
                    f"\n--- log tail ---\n{self.log_tail()}"
                )
            try:
                with _OPENER.open(f"{self.url}/-/ready", timeout=2) as resp:
                    if resp.status == 200:
                        return
                    last = f"HTTP {resp.status}"
            except (urllib.error.URLError, OSError) as e:
                last = str(e)
            time.sleep(0.1)
        raise PrometheusError(
            f"prometheus not ready after {self.ready_timeout}s ({last})"
            f"\n--- log tail ---\n{self.log_tail()}"
        )

    def stop(self) -> None:
        self._terminate()
        self._cleanup()

    def _terminate(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def _cleanup(self) -> None:
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, PrometheusError):
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- HTTP API -------------------------------------------------------------------------

    def _api(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        url = f"{self.url}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with _OPENER.open(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:
            # The API answers 4xx/5xx with a JSON body that says what was wrong with the query.
            raw = e.read().decode("utf-8", "replace")
            try:
                body = json.loads(raw)
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {e.code}: {raw}") from e
        except (urllib.error.URLError, OSError) as e:
            raise PrometheusError(f"GET {url}: {e}\n--- log tail ---\n{self.log_tail()}") from e
        if body.get("status") != "success":
            raise PrometheusError(
                f"GET {url}: {body.get('errorType', 'error')}: {body.get('error', body)}"
            )
        return body["data"]

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """Instant query; scalars and strings come back as one label-less sample for uniformity."""
        params = {"query": promql}
        if at is not None:
            params["time"] = repr(float(at))
        data = self._api("/api/v1/query", params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def exemplars(self, promql: str, start: float, end: float) -> list[dict[str, Any]]:
        """The exemplars of the series `promql` selects over [start, end] (stored only with
        `--enable-feature=exemplar-storage`)."""
        params = {"query": promql, "start": repr(float(start)), "end": repr(float(end))}
        return self._api("/api/v1/query_exemplars", params)

    def query_value(self, promql: str) -> float:
        """Exactly one sample or an error: a silent pick among several would hide label bugs."""
        result = self.query(promql)
        if len(result) != 1:
            raise PrometheusError(f"{promql!r}: expected one sample, got {len(result)}: {result}")
        return float(result[0]["value"][1])

    def targets(self, state: str = "active") -> list[dict[str, Any]]:
        data = self._api("/api/v1/targets", {"state": state})
        key = "droppedTargets" if state == "dropped" else "activeTargets"
        return data.get(key, [])

    def wait_until_up(self, job: str, timeout: float = WAIT) -> list[dict[str, Any]]:
        """Block until the first scrapes succeeded; on timeout report each target's lastError."""
        deadline = time.monotonic() + timeout
        mine: list[dict[str, Any]] = []
        while True:
            mine = [t for t in self.targets() if t.get("labels", {}).get("job") == job]
            if mine and all(t.get("health") == "up" for t in mine):
                return mine
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        states = [
            f"{t.get('scrapeUrl')}: {t.get('health')} {t.get('lastError', '')}".rstrip()
            for t in mine
        ] or ["(no targets for this job)"]
        raise TimeoutError(
            f"job {job!r} not up after {timeout}s:\n  "
            + "\n  ".join(states)
            + f"\n--- log tail ---\n{self.log_tail()}"
        )

    def wait_for(
        self,
        promql: str,
        predicate: Callable[[list[dict[str, Any]]], bool],
        timeout: float = WAIT,
        interval: float = 0.2,
    ) -> list[dict[str, Any]]:
        """Poll instead of sleeping a guessed number of scrape intervals; returns the result.

        A query error is raised at once: a bad PromQL string will not get better by waiting.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(promql)
            if predicate(result):
                return result
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{promql!r} never satisfied the predicate; last: {result}")
            time.sleep(interval)
