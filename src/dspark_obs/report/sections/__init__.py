"""One module per report section, each turning the arms into its tables, figures and
`missing` lines; the report orders them and decides when each can be built."""

from .calibration import calibration_section
from .cost import context_tables, cost_quality_table, cost_section
from .estimator import estimator_section
from .load import load_section
from .policies import policies_section
from .requests import requests_section
from .workloads import workloads_section

__all__ = [
    "calibration_section",
    "context_tables",
    "cost_quality_table",
    "cost_section",
    "estimator_section",
    "load_section",
    "policies_section",
    "requests_section",
    "workloads_section",
]
