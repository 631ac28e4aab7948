"""The optional compiled parts (everything else is in pyproject.toml).

All are `optional=True`: where no C compiler is available the install still
succeeds without them, and the package falls back to its numpy forms (same results):
`telemetry/server_info_columnar.py` decodes with msgspec and numpy alone,
`aggregates/tokens.py`, `aggregates/confidence.py` and `analysis/reliability.py` fold
request rows with numpy, `estimator/tails.py` walks with numpy,
`store/part_bounds.py` reads Parquet metadata in Python, and `runtime/hashing.py` fills
the runtime's tables of keyed normals with numpy. `DSPARK_OBS_NO_EXTENSIONS=1`
makes an install that has them use those forms too (`dspark_obs/extensions.py`; README,
"C extensions").
"""

import numpy
from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "dspark_obs.telemetry._server_info_parser",
            sources=["src/dspark_obs/telemetry/_server_info_parser.c"],
            optional=True,
        ),
        Extension(
            "dspark_obs.aggregates._rowfold",
            sources=["src/dspark_obs/aggregates/_rowfold.c"],
            include_dirs=[numpy.get_include()],
            optional=True,
        ),
        Extension(
            "dspark_obs.store._thrift_compact",
            sources=["src/dspark_obs/store/_thrift_compact.c"],
            optional=True,
        ),
        Extension(
            "dspark_obs.runtime._hashing",
            sources=["src/dspark_obs/runtime/_hashing.c"],
            include_dirs=[numpy.get_include()],
            optional=True,
        ),
        Extension(
            "dspark_obs.estimator._tailwalk",
            sources=["estimator/_tailwalk.c"],
            include_dirs=[numpy.get_include()],
            optional=True,
        ),
    ]
)
