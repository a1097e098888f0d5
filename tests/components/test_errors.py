"""The error hierarchy: distinct types, carried fields, and survival across pickling (as between processes)."""

import pickle

import pytest

from components import errors


def test_hierarchy_keeps_timeout_apart_from_peer_failure():
    assert issubclass(errors.PeerFailureError, errors.TransportError)
    assert issubclass(errors.ServiceTimeoutError, errors.TransportError)
    assert issubclass(errors.ServiceTimeoutError, TimeoutError)
    assert not issubclass(errors.ServiceTimeoutError, errors.PeerFailureError)
    assert not issubclass(errors.PeerFailureError, errors.ServiceTimeoutError)
    assert issubclass(errors.IncompatibleCombinationError, errors.ConfigurationError)
    assert issubclass(errors.NotImplementedYetError, errors.ConfigurationError)
    assert issubclass(errors.LayoutError, errors.TransportError)
    for cls in (errors.ConfigurationError, errors.TransportError, errors.RemoteError):
        assert issubclass(cls, errors.ServiceError)


def test_remote_error_carries_type_message_and_traceback_text():
    try:
        {}["missing"]
    except KeyError as exc:
        remote = errors.RemoteError.from_exception(exc)
    assert remote.remote_type == "KeyError"
    assert remote.remote_message == "'missing'"
    assert "Traceback" in remote.remote_traceback and "test_errors.py" in remote.remote_traceback
    back = pickle.loads(pickle.dumps(remote))
    assert (back.remote_type, back.remote_message, back.remote_traceback) == (
        remote.remote_type,
        remote.remote_message,
        remote.remote_traceback,
    )
    assert "KeyError: 'missing'" in str(back)


def test_configuration_error_shows_path_and_alternatives():
    exc = errors.IncompatibleCombinationError("bad", path="components.replay.transport", alternatives=("auto", "ray"))
    text = str(exc)
    assert "full_key: components.replay.transport" in text
    assert "supported: auto, ray" in text
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is errors.IncompatibleCombinationError
    assert back.path == exc.path and back.alternatives == exc.alternatives


def test_layout_error_names_key_expected_and_got():
    exc = errors.LayoutError(("next", "observation"), "shape [4]", "shape [5]")
    assert exc.key == ("next", "observation")
    assert str(exc) == "payload key 'next.observation': expected shape [4], got shape [5]"
    back = pickle.loads(pickle.dumps(exc))
    assert (back.key, back.expected, back.got) == (exc.key, exc.expected, exc.got)
    with pytest.raises(ValueError):  # also a ValueError, for callers that catch the builtin
        raise exc
