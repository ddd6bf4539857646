"""Every primitive, one file per family; importing this package registers them all.

Atomic families first (elementwise, reductions, movement, linalg), then the composites whose
decompositions are written over them. `P.<name>_p` reaches any primitive.
"""

from . import elementwise, linalg, movement, reductions  # noqa: F401
from .elementwise import *  # noqa: F401,F403
from .linalg import dot_general_p  # noqa: F401
from .movement import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from . import activations, math, random, reduce_composite, rnn, tensor  # noqa: F401,E402
from .activations import *  # noqa: F401,F403,E402
from .math import *  # noqa: F401,F403,E402
from .random import *  # noqa: F401,F403,E402
from .reduce_composite import *  # noqa: F401,F403,E402
from .rnn import *  # noqa: F401,F403,E402
from .tensor import *  # noqa: F401,F403,E402
# These import tgx.numpy at module level, which needs every primitive above.
from . import attention, conv, fused, layers, losses, norms  # noqa: F401,E402
