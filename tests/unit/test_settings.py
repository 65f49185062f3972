from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.settings import Settings, parse_tokens


def test_defaults():
    s = Settings.from_env({})
    assert (s.host, s.port, s.auth_mode, s.fusion, s.database_url) == ("127.0.0.1", 9324, "header", True, None)
    assert s.vacuum_interval == 1.0 and Settings.from_env({"CONVEYOR_VACUUM_INTERVAL": "0"}).vacuum_interval == 0


def test_environment_and_overrides():
    env = {"DATABASE_URL": "postgresql://x/y", "CONVEYOR_PORT": "8000", "CONVEYOR_FUSION": "off",
           "CONVEYOR_DATA_DIR": "/tmp/d", "CONVEYOR_AUTH": "token", "CONVEYOR_AUTH_TOKENS": "a:read, b:admin"}
    s = Settings.from_env(env, port=9000, host=None)
    assert s.port == 9000 and s.host == "127.0.0.1" and s.fusion is False
    assert s.data_dir == Path("/tmp/d") and s.auth_tokens == {"a": "read", "b": "admin"}


@pytest.mark.parametrize("env, fragment", [
    ({"CONVEYOR_PORT": "http"}, "CONVEYOR_PORT"),
    ({"CONVEYOR_PORT": "70000"}, "port"),
    ({"CONVEYOR_FUSION": "maybe"}, "CONVEYOR_FUSION"),
    ({"CONVEYOR_AUTH": "magic"}, "auth mode"),
    ({"CONVEYOR_AUTH": "token"}, "CONVEYOR_AUTH_TOKENS"),
    ({"CONVEYOR_AUTH_TOKENS": "nocolon"}, "TOKEN:"),
    ({"CONVEYOR_POOL_MIN": "5", "CONVEYOR_POOL_MAX": "2"}, "pool"),
    ({"CONVEYOR_QUEEN_CREATE_ON_PUSH": "write"}, "create-on-push"),
    ({"CONVEYOR_QUEEN_CREATE_PER_PUSH": "0"}, "per push"),
    ({"CONVEYOR_QUEEN_CREATE_MAX_QUEUES": "-1"}, "per push"),
    ({"CONVEYOR_VACUUM_INTERVAL": "-1"}, "vacuum interval"),
    ({"CONVEYOR_VACUUM_INTERVAL": "inf"}, "vacuum interval"),
    ({"CONVEYOR_VACUUM_INTERVAL": "nan"}, "vacuum interval"),
])
def test_bad_values_name_the_variable(env, fragment):
    with pytest.raises(ValueError, match=fragment):
        Settings.from_env(env)


def test_tokens_may_contain_colons():
    assert parse_tokens("a:b:c:write") == {"a:b:c": "write"}


def test_queens_create_on_push_is_bounded_by_default():
    s = Settings.from_env({})
    assert (s.queen_create_on_push, s.queen_create_per_push, s.queen_create_max_queues) == ("any", 10, 10000)
    s = Settings.from_env({"CONVEYOR_QUEEN_CREATE_ON_PUSH": " Admin ", "CONVEYOR_QUEEN_CREATE_MAX_QUEUES": "0"})
    assert (s.queen_create_on_push, s.queen_create_max_queues) == ("admin", 0)
