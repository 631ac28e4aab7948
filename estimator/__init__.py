"""The ceiling under trimming: recovering what full verification would have accepted.

Installed as `dspark_obs.estimator`. Compact runs censor the ceiling whenever a
request's whole window is accepted; the estimators that undo that censoring
live here.
"""
