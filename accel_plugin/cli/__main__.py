"""``python -m accel_plugin.cli``: the ``accel`` command."""

import sys

from .main import main

sys.exit(main())
