"""The configuration reference the documentation site shows is generated from the schema dataclasses: every key,
nested nodes included, with the type, default and range the config checks use."""

from launcher.reference import configuration


def test_the_reference_holds_every_key_of_optional_nodes_with_its_range():
    text = configuration()
    assert "| `env.atari` | AtariConfig or null | `null` |" in text
    assert "| `env.atari.frame_skip` | int | `4` | >= 1 |" in text  # the fields of a node only env=atari sets
    assert "| `env.atari.repeat_action_probability` | float | `0.25` | in [0, 1] |" in text
    for key in ("launcher.torch_threads", "recipe.encoder", "recipe.normalize_observations", "recipe.device",
                "components.inference.policy_device"):
        assert f"| `{key}` |" in text, key
