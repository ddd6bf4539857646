"""Pytrees: OrderedDict (torch `state_dict()`), defaultdict, dataclasses (frozen too) and named
tuples as arguments and results of traced and compiled functions and of `tgx.grad`, and errors
that name a leaf by its key path (`params['layers'][3]['w']`)."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, defaultdict, namedtuple

import numpy as np
import pytest

import tgx
import tgx.numpy as tnp
from tgx.errors import BindingError, DTypeError
from tgx import tracing
from tgx.tracing import leaf_names, tree_flatten, tree_map, tree_unflatten

Pair = namedtuple("Pair", "w b")


@dataclasses.dataclass
class Linear:
    w: object
    b: object


@dataclasses.dataclass(frozen=True)
class Frozen:
    w: object
    name: str = dataclasses.field(default="lin", metadata={"static": True})


@dataclasses.dataclass(frozen=True, slots=True)
class Slotted:
    a: object
    b: object = None


@dataclasses.dataclass
class Checked:
    w: object

    def __post_init__(self):  # runs on the user's arrays, not on tracers or avals
        assert isinstance(self.w, np.ndarray)


def f32(*shape, fill=1.0):
    return np.full(shape, fill, np.float32)


def compiled(fn):
    return tgx.compile(fn, policy="heuristic", backends=["numpy"])


# ---------------------------------------------------------------------------------------------
# Structure


def test_ordered_dict_keeps_insertion_order_and_type():
    sd = OrderedDict([("z.weight", 1), ("a.weight", 2), ("m.bias", 3)])
    leaves, td = tree_flatten(sd)
    assert leaves == [1, 2, 3]                      # state_dict order, not sorted
    back = tree_unflatten(td, [10, 20, 30])
    assert type(back) is OrderedDict and list(back.items()) == [
        ("z.weight", 10), ("a.weight", 20), ("m.bias", 30)]
    assert td != tree_flatten({"z.weight": 1, "a.weight": 2, "m.bias": 3})[1]


def test_defaultdict_keeps_its_factory_and_sorts_keys():
    d = defaultdict(list, {"b": 1, "a": 2})
    leaves, td = tree_flatten(d)
    assert leaves == [2, 1]
    back = tree_unflatten(td, [5, 6])
    assert type(back) is defaultdict and back.default_factory is list
    assert dict(back) == {"a": 5, "b": 6}
    assert td == tree_flatten(defaultdict(list, {"a": 0, "b": 0}))[1]
    assert td != tree_flatten(defaultdict(int, {"a": 0, "b": 0}))[1]
    assert hash(td) == hash(tree_flatten(defaultdict(list, {"a": 0, "b": 0}))[1])


@pytest.mark.parametrize("make", [
    lambda: Linear(f32(2), f32(3)),
    lambda: Frozen(f32(2)),
    lambda: Slotted(f32(2), [f32(1), f32(3)]),
    lambda: Checked(f32(2)),
])
def test_dataclasses_are_pytrees_whose_fields_are_children(make):
    x = make()
    leaves, td = tree_flatten(x)
    assert all(isinstance(v, np.ndarray) for v in leaves) and len(leaves) >= 1
    back = tree_unflatten(td, leaves)
    assert type(back) is type(x) and back == x
    doubled = tree_map(lambda v: v * 2, x)
    assert type(doubled) is type(x)
    for a, b in zip(tree_flatten(doubled)[0], leaves):
        np.testing.assert_array_equal(a, 2 * b)
    # equal structures give equal (and equally hashed) treedefs: one trace per structure
    assert td == tree_flatten(make())[1] and hash(td) == hash(tree_flatten(make())[1])


def test_static_dataclass_fields_are_structure_not_leaves():
    leaves, td = tree_flatten(Frozen(f32(2), name="enc"))
    assert len(leaves) == 1
    assert tree_unflatten(td, [f32(2)]).name == "enc"
    assert td != tree_flatten(Frozen(f32(2), name="dec"))[1]


def test_avals_stay_leaves():
    spec = tgx.Spec(("N", 3))   # a dataclass, but an array's abstract value
    assert tree_flatten({"x": spec})[0] == [spec]


def test_dict_with_keys_of_several_types():
    leaves, td = tree_flatten({1: "a", "x": "b", 0: "c"})
    assert sorted(leaves) == ["a", "b", "c"]
    assert tree_unflatten(td, leaves) == {1: "a", "x": "b", 0: "c"}


def test_key_paths_name_every_kind_of_node():
    tree = {"layers": [{"w": 0}, OrderedDict([("q.weight", 0)])], "p": Pair(0, 0),
            "lin": Linear(0, (0,)), "d": defaultdict(int, {"k": 0})}
    assert tracing.leaf_paths(tree_flatten(tree)[1], "params") == [
        "params['d']['k']", "params['layers'][0]['w']", "params['layers'][1]['q.weight']",
        "params['lin'].w", "params['lin'].b[0]", "params['p'].w", "params['p'].b"]
    td = tree_flatten(((tree, 0), {"scale": 0}))[1]
    names = leaf_names(td, 9, arg_names=["params"])
    assert names[0] == "params['d']['k']" and names[-2:] == ["args[1]", "scale"]


# ---------------------------------------------------------------------------------------------
# In traced and compiled functions and in grad


def _loss(p, x):
    h = x @ p["lin"].w + p["lin"].b
    return (tnp.sum(h * h) + tnp.sum(p["sd"]["b.weight"] * 2.0) + tnp.sum(p["dd"]["g"])
            + tnp.sum(p["frozen"].w) + tnp.sum(p["pair"].w))


def _params(rng):
    return {
        "lin": Linear(rng.standard_normal((3, 2)).astype(np.float32), f32(2)),
        "sd": OrderedDict([("b.weight", f32(2)), ("a.weight", f32(4))]),
        "dd": defaultdict(list, {"g": f32(3)}),
        "frozen": Frozen(f32(2), name="enc"),
        "pair": Pair(f32(2), f32(1)),
    }


def _reference(p, x):
    h = x @ p["lin"].w + p["lin"].b
    return (np.sum(h * h) + np.sum(p["sd"]["b.weight"] * 2) + np.sum(p["dd"]["g"])
            + np.sum(p["frozen"].w) + np.sum(p["pair"].w))


def test_containers_as_arguments_and_results_of_compiled_functions(rng):
    p, x = _params(rng), rng.standard_normal((4, 3)).astype(np.float32)
    f = compiled(lambda p, x: (_loss(p, x), p))   # the params come back, same containers
    for _ in range(2):
        loss, back = f(p, x)
        np.testing.assert_allclose(loss, _reference(p, x), rtol=1e-5)
    assert f.trace_count == 1
    assert type(back["sd"]) is OrderedDict and list(back["sd"]) == ["b.weight", "a.weight"]
    assert type(back["dd"]) is defaultdict and back["dd"].default_factory is list
    assert type(back["lin"]) is Linear and type(back["frozen"]) is Frozen
    assert back["frozen"].name == "enc" and type(back["pair"]) is Pair
    np.testing.assert_array_equal(back["lin"].w, p["lin"].w)
    g = tgx.make_graph(_loss)(p, tgx.Spec(("N", 3)))
    np.testing.assert_allclose(tgx.eval_graph(g, p, x), _reference(p, x), rtol=1e-5)


def test_grad_returns_the_same_containers(rng):
    p, x = _params(rng), rng.standard_normal((4, 3)).astype(np.float32)
    for grads in (tgx.grad(_loss)(p, x), compiled(tgx.grad(_loss))(p, x)):
        assert type(grads["sd"]) is OrderedDict and list(grads["sd"]) == ["b.weight", "a.weight"]
        assert type(grads["dd"]) is defaultdict and type(grads["lin"]) is Linear
        assert grads["frozen"].name == "enc" and type(grads["pair"]) is Pair
        np.testing.assert_allclose(grads["sd"]["b.weight"], np.full(2, 2.0), rtol=1e-6)
        np.testing.assert_allclose(grads["sd"]["a.weight"], np.zeros(4), atol=0)
        h = x @ p["lin"].w + p["lin"].b
        np.testing.assert_allclose(grads["lin"].w, x.T @ (2 * h), rtol=1e-5)
        np.testing.assert_allclose(grads["lin"].b, (2 * h).sum(0), rtol=1e-5)


def test_vmap_over_a_dataclass():
    lin = Linear(np.ones((5, 3, 2), np.float32), np.ones((5, 2), np.float32))
    out = tgx.vmap(lambda l: tnp.sum(l.w) + tnp.sum(l.b))(lin)
    np.testing.assert_array_equal(out, np.full(5, 8.0, np.float32))


# ---------------------------------------------------------------------------------------------
# Errors name the leaf by its key path


def test_bad_leaf_is_named_by_its_key_path():
    params = {"layers": [{"w": f32(2)} for _ in range(4)]}
    params["layers"][3]["w"] = "not an array"
    with pytest.raises(DTypeError, match=r"argument params\['layers'\]\[3\]\['w'\] has type str"):
        tgx.make_graph(lambda params, x: x)(params, f32(2))
    with pytest.raises(DTypeError, match=r"argument xs\[1\]\.b has type str"):
        tgx.make_graph(lambda *xs: xs[0])(f32(1), Linear(f32(1), "s"))


def test_bad_output_is_named_by_its_key_path():
    with pytest.raises(DTypeError, match=r"returned a str at output\['a'\]\[1\]"):
        tgx.make_graph(lambda x: {"a": [x, "oops"]})(f32(2))


def test_binding_errors_name_ordered_dict_keys_and_fields():
    sd = OrderedDict([("layers.0.w", f32(3, 2)), ("layers.1.w", f32(3, 2))])
    g = tgx.make_graph(lambda sd, lin: sd["layers.1.w"].sum() + lin.w.sum())(
        sd, Linear(f32(2), f32(1)))
    bad = OrderedDict([("layers.0.w", f32(3, 2)), ("layers.1.w", f32(3, 5))])
    with pytest.raises(BindingError, match=r"args\[0\]\['layers\.1\.w'\]: expected shape"):
        tgx.eval_graph(g, bad, Linear(f32(2), f32(1)))
    with pytest.raises(DTypeError, match=r"args\[1\]\.w: expected dtype float32"):
        tgx.eval_graph(g, sd, Linear(np.ones(2), f32(1)))
    f = compiled(lambda sd: sd["layers.1.w"].sum())
    plan = f.lower(sd)
    with pytest.raises(BindingError, match=r"\['layers\.1\.w'\]: expected float32 \(3, 2\)"):
        plan.run(bad)
