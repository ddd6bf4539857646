"""Every primitive, one file per family; importing this package registers them all."""

from . import elementwise, linalg, movement, reductions  # noqa: F401
from .elementwise import *  # noqa: F401,F403
from .linalg import dot_general_p  # noqa: F401
from .movement import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
