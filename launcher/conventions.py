"""The command line's conventions: exit statuses and how arguments are read. A leaf: it imports nothing of the
launcher, so every phase and the Hydra plugins share it without import cycles.

=====  =====================================================================================
 0     the recipe finished
 1     an error in the recipe or the launcher itself (its traceback is printed)
 2     a configuration error (nothing was started)
 3     a service died during the run, or failed to start (one line names it; the traceback is in ``launcher.log``)
 4     the disk (or quota) filled up: one line names what could not be written; what was written before is kept
130    interrupted by Ctrl-C (SIGINT): every service was shut down in order
143    stopped by SIGTERM: the same orderly shutdown
=====  =====================================================================================
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_SERVICE_DIED = 3
EXIT_NO_SPACE = 4
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


def normalize_argv(argv: list[str]) -> list[str]:
    """Accept ``+recipe=ppo`` as well as ``recipe=ppo`` (the defaults list already holds ``recipe: null``)."""
    out = []
    for arg in argv:
        if arg.startswith("+recipe=") or arg.startswith("++recipe="):
            arg = arg.lstrip("+")
        out.append(arg)
    return out
