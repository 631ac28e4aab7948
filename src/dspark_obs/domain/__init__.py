"""The concepts the simulator, the live aggregates, the estimator and the analysis share.

The step-cost table and its tiers (`cost_table`), what a step's time is made of and its
least-squares fit (`step_cost`), workloads as integer codes (`workload_codes`). They sit
below every layer that uses them, so none of those imports another for a definition.
"""
