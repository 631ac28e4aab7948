"""One selector for every query of the dashboards and the rules, as monitoring mixins do.

An operator's Prometheus holds other jobs' series beside dspark-obs's, and sometimes two
dspark-obs deployments; the dashboards and the rules as shipped read every `dspark_*`
series there is, and `up{job=~"dspark.*"}` for the exporters' health. `with_selector` puts
the operator's selector (`job="dspark-prod"`, `cluster="eu"`, ...) into every selector of
an exporter's own series in a PromQL expression (names `dspark_...`, and `up`, whose job
matcher it replaces), and `sglang` likewise into the SGLang gauges' selectors; recorded
series (`level:metric:operation`) are left alone, since the rules that record them
selected already. Quoted strings are never touched.
"""

from __future__ import annotations

import re
from pathlib import Path

#: a quoted PromQL string, kept as it is
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
#: a series of an exporter of ours, not part of a recorded series' name
_OURS = re.compile(r"(?<![\w:])(dspark_\w+)(?![\w:(])(\{[^}]*\})?")
#: `up`, with its matchers
_UP = re.compile(r"(?<![\w:])up(?![\w:(])(\{[^}]*\})?")
#: a selector by name (`{__name__=~"sglang..."}`, `{__name__=~"dspark..."}`)
_BY_NAME = re.compile(r'\{(__name__=~?"(dspark|sglang)[^"]*"[^}]*)\}')
#: what `up` is matched on where no selector is given
UP_DEFAULT = 'job=~"dspark.*"'


def _join(matchers: str, selector: str) -> str:
    return ", ".join(m for m in (selector, matchers.strip()) if m)


def with_selector(expr: str, selector: str = "", sglang: str = "") -> str:
    """`expr` with `selector` in every selector of our series (and `sglang` in the SGLang
    gauges'); `up` gets `selector` in place of its default job matcher."""
    if selector:
        expr = _UP.sub(lambda m: _up(m.group(1), selector), expr)
    pieces = _QUOTED.split(expr)
    quoted = _QUOTED.findall(expr)
    text = "\x00".join(pieces)  # quoted strings out of the way, their places kept

    def ours(m: re.Match[str]) -> str:
        name, braces = m.group(1), m.group(2)
        inner = braces[1:-1] if braces else ""
        return f"{name}{{{_join(inner, selector)}}}"

    if selector:
        text = _OURS.sub(ours, text)
    out = []
    for i, piece in enumerate(text.split("\x00")):
        out.append(piece)
        if i < len(quoted):
            out.append(quoted[i])
    expr = "".join(out)

    def by_name(m: re.Match[str]) -> str:
        extra = sglang if m.group(2) == "sglang" else selector
        return f"{{{_join(m.group(1), extra)}}}" if extra else m.group(0)

    return _BY_NAME.sub(by_name, expr)


def _up(braces: str | None, selector: str) -> str:
    """`up` with `selector` in place of the job matcher it had."""
    kept = [m.strip() for m in (braces or "{}")[1:-1].split(",")]
    kept = [m for m in kept if m and not m.startswith("job")]
    return f"up{{{_join(', '.join(kept), selector)}}}"


def rules_with_selector(text: str, selector: str = "", sglang: str = "",
                        runbook_base: str | None = None) -> str:  # fmt: skip
    """A rules file with `with_selector` applied to each rule's `expr` (inline or a `|`
    block), and, with `runbook_base`, each `runbook_url` pointed at that base."""
    lines = text.split("\n")
    out = []
    block_indent: int | None = None
    for line in lines:
        indent = len(line) - len(line.lstrip())
        if block_indent is not None and (not line.strip() or indent >= block_indent):
            out.append(with_selector(line, selector, sglang) if line.strip() else line)
            continue
        block_indent = None
        stripped = line.strip()
        if stripped.startswith("expr:"):
            value = stripped[len("expr:") :].strip()
            if value in ("|", "|-", ">", ">-"):
                block_indent = indent + 2
                out.append(line)
            else:
                out.append(line[:indent] + "expr: " + with_selector(value, selector, sglang))
            continue
        if runbook_base is not None and stripped.startswith("runbook_url:"):
            anchor = stripped.split("#", 1)[1] if "#" in stripped else ""
            url = f"{runbook_base.rstrip('/')}/runbooks.md" + (f"#{anchor}" if anchor else "")
            out.append(f"{line[:indent]}runbook_url: {url}")
            continue
        out.append(line)
    return "\n".join(out)


#: The rules files shipped with the package (copies of deploy/rules, held equal by a test).
RULES = ("recording.yml", "fleet.yml", "alerts.yml")


def shipped_rules(name: str) -> str:
    return (Path(__file__).with_name("rules") / name).read_text(encoding="utf-8")
