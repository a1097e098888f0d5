"""Examples of your own code chosen from YAML by ``_target_`` (see the README, "Your own code from YAML")."""
