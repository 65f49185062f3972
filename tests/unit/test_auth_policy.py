"""The authentication policy in isolation (conveyor.protocols.auth)."""

from __future__ import annotations

import hmac

import pytest

from conveyor import errors
from conveyor.protocols import auth
from conveyor.settings import parse_credentials

TOKENS = {"alpha": "read", "beta": "write", "gamma": "admin"}


def test_tokens_are_compared_in_constant_time(monkeypatch):
    """Every configured token is compared, whichever matches and wherever a mismatch
    starts, and each comparison is hmac.compare_digest over equal-length digests."""
    calls = []
    real = hmac.compare_digest

    def counting(a, b):
        calls.append((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    policy = auth.Policy("token", TOKENS)
    for given, role in (("alpha", "read"), ("gamma", "admin"), ("alph", None), ("", None), ("x" * 500, None)):
        calls.clear()
        assert policy.token_role(given) == role
        assert len(calls) == len(TOKENS) and {c for c in calls} == {(32, 32)}


def test_http_identities_by_mode():
    assert auth.Policy("none").http(None) == auth.ADMIN
    with pytest.raises(errors.Unauthorized):
        auth.Policy("header").http(None)
    assert auth.Policy("header").http("anything") == auth.ADMIN
    token = auth.Policy("token", TOKENS)
    assert token.http("Bearer beta").role == "write" and token.http("bearer  beta ").role == "write"
    for bad in (None, "beta", "Basic beta", "Bearer ", "Bearer delta"):
        with pytest.raises(errors.Unauthorized):
            token.http(bad)
    assert auth.Identity("write").may("read") and not auth.Identity("write").may("admin")


def test_aws_credentials_carry_roles():
    assert parse_credentials("K1:s1,K2:s2:read") == {"K1": ("s1", "admin"), "K2": ("s2", "read")}
    with pytest.raises(ValueError):
        parse_credentials("K1:s1:owner")
    policy = auth.Policy("none", aws_credentials=parse_credentials("K1:s1,K2:s2:read"))
    assert policy.verifies_signatures and policy.aws_secrets == {"K1": "s1", "K2": "s2"}
    assert policy.aws_role("K2") == "read"
