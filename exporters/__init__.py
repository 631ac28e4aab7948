"""Publishing what dspark-obs measures: the Prometheus exporter and its HTTP server.

Installed as `dspark_obs.exporters`.
"""
