"""`tgx.nn` (imported as `tnn`): composite neural-network ops with `torch.nn.functional` names,
argument order and layouts (NCHW, torch weight layouts; `dim=` with `axis=` as an alias).

Each op binds one composite primitive that stays whole in the traced graph and decomposes into
atomic primitives on request (`tgx.decompose`).
"""

from .activations import *  # noqa: F401,F403
from .attention import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .layers import *  # noqa: F401,F403
from .losses import *  # noqa: F401,F403
from .norms import *  # noqa: F401,F403
from .recurrent import *  # noqa: F401,F403
