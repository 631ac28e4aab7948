"""The Triton kernel's columns and switches against `step_layout`, on a CPU.

The kernel holds no column offset or flag bit of its own: every column it writes is a
compile-time parameter `C_<FIELD>` that `pack_triton.kernel_constants` fills from the
layout, and every switch (`HAS_TARGET`, ...) is set from the step's flag bits. Read from
the kernel's source, without Triton and without compiling, so that a drift shows here and
not only on a GPU (tests/test_pack_triton_gpu.py).
"""

from __future__ import annotations

import ast
import inspect

import pytest

from dspark_obs.hooks import pack_triton, step_layout
from dspark_obs.hooks.step_layout import PER_DRAFT, PER_GATHER, SCALARS, StepLayout


def kernel_def() -> ast.FunctionDef:
    """The `pack` kernel as `_kernel` defines it."""
    tree = ast.parse(inspect.getsource(pack_triton._kernel).lstrip())
    found = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "pack"]
    assert len(found) == 1
    return found[0]


def is_constexpr(arg: ast.arg) -> bool:
    return arg.annotation is not None and ast.unparse(arg.annotation) == "tl.constexpr"


@pytest.mark.parametrize(("gamma", "entries"), [(1, 1), (4, 4), (7, 4), (16, 2)])
def test_the_kernel_constants_are_the_layouts_columns(gamma, entries):
    layout = StepLayout(gamma, entries)
    constants = pack_triton.kernel_constants(layout)
    assert set(layout.columns) == {*SCALARS, *PER_DRAFT, *PER_GATHER}
    assert constants == {f"C_{name.upper()}": cols.start for name, cols in layout.columns.items()}


def test_the_kernel_takes_every_column_and_switch_from_the_layout():
    params = kernel_def().args.args
    constexprs = [a.arg for a in params if is_constexpr(a)]
    columns = list(pack_triton.kernel_constants(StepLayout(4)))
    # the column parameters, last and in the layout's order
    assert constexprs[-len(columns) :] == columns
    switches = [name for name, _ in pack_triton.SWITCHES]
    assert set(switches) <= set(constexprs)
    # each switch is one of the step's flag bits, all of them distinct
    bits = [bit for _, bit in pack_triton.SWITCHES]
    assert all(bit == getattr(step_layout, name) for name, bit in pack_triton.SWITCHES)
    assert len(set(bits)) == len(bits) and all(bit & (bit - 1) == 0 for bit in bits)
    # no column or flag of the kernel's own: every C_* name it reads is a parameter, and no
    # switch is computed from a bitmask
    body = kernel_def().body
    used = {n.id for stmt in body for n in ast.walk(stmt) if isinstance(n, ast.Name)}
    assert {name for name in used if name.startswith("C_")} == set(columns)
    assigned = {
        t.id
        for stmt in body
        for n in ast.walk(stmt)
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in ([n.target] if isinstance(n, ast.AnnAssign) else n.targets)
        if isinstance(t, ast.Name)
    }
    assert not {name for name in assigned if name.startswith(("C_", "HAS_"))}


def test_the_kernel_reads_the_steps_inputs_by_their_names():
    """The pointer arguments carry the ObservedStep fields' names, and those are the ones
    compiled for any address."""
    names = [a.arg for a in kernel_def().args.args if not is_constexpr(a)]
    inputs = list(pack_triton.INPUTS)
    at = names.index(inputs[0])
    assert names[at : at + len(inputs)] == inputs
    assert set(pack_triton._UNSPECIALISED) == {"seq", *inputs} and "seq" in names


def test_every_function_of_the_kernel_is_compiled():
    """A helper the kernel calls without `@triton.jit` fails only when Triton compiles it."""
    tree = ast.parse(inspect.getsource(pack_triton._kernel).lstrip())
    nested = [n for n in ast.walk(tree.body[0]) if isinstance(n, ast.FunctionDef)][1:]
    assert {n.name for n in nested} >= {"row_slice", "row_lse", "tails_load", "walk", "pack"}
    for fn in nested:
        assert any(ast.unparse(d).startswith("triton.jit") for d in fn.decorator_list), fn.name
