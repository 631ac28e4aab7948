"""The fleet dashboard's rows, one module per row, in page order (as `rows` for the main one).

Every figure is computed from counters summed over the chosen series (`fleet_promql`), never
from an average of the exporters' ratio gauges.
"""

from . import breakdown, fleet, per_workload

ROWS = (
    ("Fleet", fleet.panels),
    ("Fleet by workload", per_workload.panels),
    ("Per node", breakdown.per_node),
    ("Per rank", breakdown.per_rank),
)
