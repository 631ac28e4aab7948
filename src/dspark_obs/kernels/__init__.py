"""Device kernels for in-band work on the serving GPU.

Importing this package pulls in nothing: torch and Triton are imported inside
the functions, so the kernels can be tested and benchmarked on a machine that
has only torch (and Triton), without the rest of dspark-obs's dependencies.
"""
