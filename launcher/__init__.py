"""The launcher: compose a Hydra config, plan the topology as data, then run (or print) it.

    python -m launcher +recipe=ppo
    python -m launcher +recipe=ppo service=process transport=shared_memory launcher.dry_run=true
    python -m launcher.matrix
"""
