"""Wire layouts: taken from a representative TensorDict, validated key by key, extra keys dropped."""

import pickle

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from transports import Layout, LayoutError


def _td(obs_shape=(3, 4), dtype=torch.float32, extra=False):
    td = TensorDict(
        {"observation": torch.zeros(obs_shape, dtype=dtype), "nested": {"mask": torch.ones(3, dtype=torch.bool)}},
        batch_size=[3],
    )
    if extra:
        td["extra"] = torch.ones(3)
    return td


def test_layout_is_sorted_nested_keys_with_shape_dtype_device():
    layout = Layout.from_tensordict(_td())
    assert layout.keys == [("nested", "mask"), ("observation",)]
    leaf = layout.leaves[1]
    assert (leaf.shape, leaf.dtype, leaf.device) == ((3, 4), torch.float32, "cpu")
    assert layout.batch_size == (3,)
    assert layout.nbytes == 3 * 1 + 3 * 4 * 4
    assert pickle.loads(pickle.dumps(layout)) == layout


def test_validate_drops_extra_keys_and_keeps_values():
    layout = Layout.from_tensordict(_td())
    payload = _td(extra=True)
    payload["observation"] += 7
    out = layout.validate(payload)
    assert set(out.keys(include_nested=True, leaves_only=True)) == {("nested", "mask"), "observation"}
    assert torch.equal(out["observation"], payload["observation"])


@pytest.mark.parametrize(
    "payload, key, expected, got",
    [
        (TensorDict({"nested": {"mask": torch.ones(3, dtype=torch.bool)}}, [3]), "observation", "shape [3, 4]", "a missing key"),
        (_td(obs_shape=(3, 5)), "observation", "shape [3, 4]", "shape [3, 5]"),
        (_td(dtype=torch.float64), "observation", "dtype float32", "dtype float64"),
    ],
)
def test_mismatch_names_key_expected_and_got(payload, key, expected, got):
    layout = Layout.from_tensordict(_td())
    with pytest.raises(LayoutError) as info:
        layout.validate(payload)
    assert info.value.key == (key,)
    assert expected in info.value.expected
    assert info.value.got == got


def test_device_mismatch_is_reported():
    layout = Layout.from_tensordict(TensorDict({"x": torch.zeros(2, device="meta")}))
    with pytest.raises(LayoutError, match="expected device meta, got device cpu"):
        layout.validate(TensorDict({"x": torch.zeros(2)}))


def test_non_tensor_leaves_are_refused_with_advice():
    td = TensorDict({"x": torch.zeros(2), "text": NonTensorData("hello")})
    with pytest.raises(LayoutError, match="use transport 'queue'"):
        Layout.from_tensordict(td)


def test_zeros_builds_a_slot_bank():
    layout = Layout.from_tensordict(_td())
    bank = layout.zeros(8)
    assert bank.batch_size == torch.Size([8, 3])
    assert bank["observation"].shape == (8, 3, 4) and bank["nested", "mask"].dtype == torch.bool
