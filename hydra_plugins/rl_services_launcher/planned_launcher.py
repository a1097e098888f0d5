"""``hydra/launcher=slurm``: hydra-submitit-launcher's Slurm launcher, with each job's resources from its plan.

Before a sweep's jobs are submitted, each job's config is composed as the job will compose it and planned;
``cpus_per_task``, ``mem_gb`` and ``gpus_per_node`` left unset (``null``) take the largest needs over the jobs
(:func:`launcher.slurm.submission_parameters`), and a job no node of the partition can hold exits 2 with the
numbers before anything is submitted. Everything else is the plugin's. Without hydra-submitit-launcher installed
this module defines nothing (Hydra imports every module here at start-up).
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

from omegaconf import DictConfig, open_dict, read_write

try:
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as _PluginSlurmLauncher
except ImportError:  # pip install ".[slurm]"
    _PluginSlurmLauncher = None

if _PluginSlurmLauncher is not None:

    class SlurmLauncher(_PluginSlurmLauncher):
        """The plugin's ``SlurmLauncher``; :meth:`launch` sizes the jobs from their plans first."""

        def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
            from launcher.conventions import EXIT_CONFIG
            from launcher.slurm import submission_parameters
            from transports.kernel.errors import ConfigurationError

            try:
                self.params = submission_parameters(self.params, [self._job_config(o) for o in job_overrides])
            except ConfigurationError as exc:
                print(f"configuration error: {exc}", file=sys.stderr, flush=True)
                sys.exit(EXIT_CONFIG)
            return super().launch(job_overrides, initial_job_idx)

        def _job_config(self, overrides: Sequence[str]) -> DictConfig:
            """The config the job's task function will get (Hydra's ``run_job`` drops the ``hydra`` node)."""
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with read_write(cfg), open_dict(cfg):
                del cfg["hydra"]
            return cfg
