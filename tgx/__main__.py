"""``python -m tgx`` runs the ``tgx`` command (see `tgx.cli`)."""

import sys

from tgx.cli import main

sys.exit(main())
