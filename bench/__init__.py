"""Benchmarks: `python -m bench [--json] [--quick] [NAME...]`, one JSON object per benchmark."""
