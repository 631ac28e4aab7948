"""The optional compiled part (everything else is in pyproject.toml).

`optional=True`: where no C compiler is available the install still succeeds
without it, and `estimator/tails.py` walks with numpy (same results).
"""

import numpy
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dspark_obs.estimator._tailwalk",
            sources=["estimator/_tailwalk.c"],
            include_dirs=[numpy.get_include()],
            optional=True,
        ),
    ]
)
