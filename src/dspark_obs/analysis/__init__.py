"""Post-hoc analysis of run directories: summaries, calibration, cost fits, comparisons."""
