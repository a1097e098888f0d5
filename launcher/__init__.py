"""The launcher: compose a Hydra config, plan the topology as data, then run (or print) it.

    python -m launcher +recipe=ppo
    python -m launcher +recipe=ppo service=process transport=shared_memory launcher.dry_run=true
    python -m launcher.matrix
"""

from .own_conf import import_own_conf

import_own_conf()  # before anything asks Hydra for pkg://conf: a conf/ folder in the working directory is the user's
