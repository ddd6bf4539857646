"""Every primitive, one file per family; importing this package registers them all.

The imports form a plain DAG, in this order: the atomic families (elementwise, reductions,
movement, linalg); `ops`, the lax-level binders of atomic primitives; then the composite
families, each after the families whose binders its decompositions use (activations after
math; rnn after activations; losses after activations, math and reduce_composite; norms
after math and reduce_composite). No family imports `tgx.numpy` or anything above it.
`P.<name>_p` reaches any primitive.
"""

from . import (  # noqa: F401  # noqa: F401  # noqa: F401
    activations,
    attention,
    conv,
    derivatives,
    elementwise,
    fused,
    layers,
    linalg,
    losses,
    math,
    movement,
    norms,
    ops,  # noqa: F401
    random,
    reduce_composite,
    reductions,
    rnn,
    tensor,
)
from .activations import *  # noqa: F401,F403
from .elementwise import *  # noqa: F401,F403
from .linalg import dot_general_p  # noqa: F401
from .math import *  # noqa: F401,F403
from .movement import *  # noqa: F401,F403
from .random import *  # noqa: F401,F403
from .reduce_composite import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .tensor import *  # noqa: F401,F403
