"""The estimator's compiled parts (`_tailwalk.c`), or None.

The tail walk's per-step pass (`tails.py`) and the batch kernels that check the
extrapolation on known positions, teach the population and smooth models and extrapolate
the ended walks (`population.py`, `extrapolation_check.py`) are C where the extension
built; None where it did not, or `DSPARK_OBS_NO_EXTENSIONS` switches it off, and every
caller then takes its numpy form, which gives the same numbers.
"""

from __future__ import annotations

from dspark_obs import extensions

#: The compiled module. The batch kernels' callers read it at each call, so that the tests
#: can set it to None and hold the two forms to each other; the tail walker reads it once
#: (`TailWalker(compiled=...)` picks its pass).
KERNELS = extensions.load("dspark_obs.estimator._tailwalk")
