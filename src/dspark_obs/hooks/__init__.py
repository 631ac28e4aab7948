"""In-process hooks: dspark-obs attached inside an inference server's worker."""
