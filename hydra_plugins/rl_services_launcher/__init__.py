"""Hydra plugins of rl-services-launcher (found by Hydra's plugin scan of the ``hydra_plugins`` namespace)."""
