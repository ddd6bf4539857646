"""Golden text: the IR, the backend graph and the `Plan` printout of a small model, compared
with the files beside this test. An accidental change to printing, tracing, simplify, the
heuristic, rebackend, the schedule, the lowering or the buffer plan shows up as a diff.

After an intended change: ``TGX_UPDATE_SNAPSHOTS=1 pytest tests/snapshots`` rewrites them."""

from __future__ import annotations

import os
import pathlib

import pytest

import tgx
import tgx.nn as tnn

HERE = pathlib.Path(__file__).parent
UPDATE = os.environ.get("TGX_UPDATE_SNAPSHOTS") == "1"


def mlp(params, x):
    h = tnn.relu(x @ params["w1"] + params["b1"])
    return tnn.softmax(h @ params["w2"] * 1.0, dim=-1)   # `* 1.0`: simplify removes it


SPECS = ({"w1": tgx.Spec((16, 32)), "b1": tgx.Spec((32,)), "w2": tgx.Spec((32, 4))},
         tgx.Spec(("N", 16)))


def _plan():
    return tgx.compile(mlp, policy="heuristic", backends=["numpy"]).lower(*SPECS)


def check(name: str, text: str) -> None:
    path = HERE / f"{name}.txt"
    if UPDATE or not path.exists():
        path.write_text(text + "\n")
        if not UPDATE:
            pytest.fail(f"{path.name} did not exist: written, check it in")
    assert text + "\n" == path.read_text(), f"{path.name} changed (TGX_UPDATE_SNAPSHOTS=1 " \
                                            f"rewrites it after an intended change)"


def test_ir_text():
    check("mlp_ir", str(tgx.make_graph(mlp)(*SPECS)))


def test_backend_graph_text():
    check("mlp_backend_graph", str(_plan().stages["schedule"]))


def test_plan_text():
    check("mlp_plan", str(_plan()))


def test_stage_names():
    assert [n for n, _ in _plan().stages] == ["traced", "simplify", "patterns", "fuse", "select",
                                              "rebackend", "schedule", "lower", "buffers"]
