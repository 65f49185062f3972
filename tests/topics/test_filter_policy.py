"""SNS subscription filter policies: validation (Python) and matching (SQL), the cases
taken from Amazon SNS's documentation, plus a property test of the operators against a
small Python oracle."""

from __future__ import annotations

import json
from decimal import Decimal

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.types.json import Jsonb

from conveyor import errors
from conveyor.core import filter_policy

# -- validation --------------------------------------------------------------------------------

VALID = [
    {"store": ["example_corp"], "event": [{"anything-but": "order_cancelled"}],
     "customer_interests": ["rugby", "football", "baseball"], "price_usd": [{"numeric": [">=", 100]}]},
    {"a": [{"prefix": "x"}, {"suffix": "y"}, {"equals-ignore-case": "Z"}, "plain", 5, True, None]},
    {"a": [{"anything-but": ["x", "y"]}, {"anything-but": [1, 2]}, {"anything-but": {"prefix": "p"}},
           {"anything-but": {"suffix": "s"}}, {"anything-but": {"equals-ignore-case": ["A", "b"]}}]},
    {"a": [{"numeric": ["=", 1]}, {"numeric": [">", 0, "<=", 150]}, {"numeric": [">=", -1e9, "<", 1e9]}]},
    {"a": [{"exists": False}], "b": [{"cidr": "10.0.0.0/24"}, {"cidr": "2001:db8::/32"}]},
    {"$or": [{"a": ["1"]}, {"b": ["2"], "c": ["3"]}]},
    {},
]


@pytest.mark.parametrize("policy", VALID)
def test_valid_policies(policy):
    assert filter_policy.validate(policy) == policy
    assert filter_policy.validate(json.dumps(policy), "MessageAttributes") == policy


INVALID = [
    ("{not json", "failed to parse JSON"),
    ("[1, 2]", "must be a JSON object"),
    ({"a": "x"}, "must be an object or an array"),
    ({"a": []}, "Empty arrays are not allowed"),
    ({"a": [["nested list"]]}, "Match value must be String, number, true, false, or null"),
    ({"a": [{"prefi": "x"}]}, "Unrecognized match type prefi"),
    ({"a": [{"prefix": 5}]}, "prefix match pattern must be a string"),
    ({"a": [{"prefix": "x", "suffix": "y"}]}, "exactly one operator"),
    ({"a": [{"numeric": ["<", "5"]}]}, "Value of < must be numeric"),
    ({"a": [{"numeric": ["!=", 5]}]}, "Unrecognized numeric range operator"),
    ({"a": [{"numeric": ["<", 5, ">", 1]}]}, "lower bound"),
    ({"a": [{"numeric": [">", 5, "<", 1]}]}, "Bottom must be less than top"),
    ({"a": [{"numeric": [">", 5, "<"]}]}, "one or two"),
    ({"a": [{"numeric": ["=", 1e10]}]}, "Numeric values must be"),
    ({"a": [{"exists": "yes"}]}, "exists match pattern must be either true or false"),
    ({"a": [{"anything-but": []}]}, "Empty arrays"),
    ({"a": [{"anything-but": ["x", 1]}]}, "strings or numbers"),
    ({"a": [{"anything-but": {"numeric": [">", 1]}}]}, "Unsupported anything-but pattern"),
    ({"a": [{"cidr": "10.0.0.0"}]}, "Malformed CIDR"),
    ({"a": [{"cidr": "nonsense/8"}]}, "Malformed CIDR"),
    ({"$or": [{"a": ["1"]}]}, '"$or" must be a list of at least two'),
    ({"a": {"b": ["c"]}}, "does not support nested filter policy"),
    ({f"k{i}": ["v"] for i in range(6)}, "can not have more than 5 keys"),
    ({"$or": [{f"k{i}": ["v"]} for i in range(3)] + [{"x": ["v"], "y": ["v"], "z": ["v"]}]},
     "can not have more than 5 keys"),
    ({"a": [str(i) for i in range(13)], "b": [str(i) for i in range(12)]}, "too complex"),
    ({"a": ["x" * (256 * 1024)]}, "too large"),
]


@pytest.mark.parametrize(("policy", "message"), INVALID)
def test_invalid_policies(policy, message):
    with pytest.raises(errors.InvalidInput, match=r"^Invalid parameter: FilterPolicy: ") as info:
        filter_policy.validate(policy)
    assert message in info.value.message


def test_body_scope_allows_nesting_and_counts_top_level_keys():
    nested = {"state": ["SUCCESS"], "severity": [{"exists": True}], "message": [{"exists": True}],
              "finding": {"standard_control": [{"exists": True}], "region": [{"exists": True}],
                          "account": [{"exists": True}]}}
    assert filter_policy.validate(nested, "MessageBody") == nested
    with pytest.raises(errors.InvalidInput, match="nested"):
        filter_policy.validate(nested, "MessageAttributes")
    flat = {f"k{i}": ["v"] for i in range(5)}
    with pytest.raises(errors.InvalidInput, match="more than 5 keys"):
        filter_policy.validate({**flat, "$or": [{"a": ["1"]}, {"k0": ["2"]}]}, "MessageBody")


def test_combinations_and_scope():
    assert filter_policy.combinations({"a": ["1", "2", "3"], "b": {"c": ["1", "2"]}}) == 12  # the nested key counts twice (depth 2)
    assert filter_policy.combinations({"a": ["1", "2"], "$or": [{"b": ["1"]}, {"c": ["1", "2", "3"]}]}) == 8
    assert filter_policy.validate({"a": [str(i) for i in range(150)]}) is not None
    with pytest.raises(errors.InvalidInput, match="FilterPolicyScope"):
        filter_policy.validate({"a": ["b"]}, "Body")


# -- matching, in SQL ------------------------------------------------------------------------

def S(v: str) -> dict:
    return {"DataType": "String", "StringValue": v}


def N(v: str) -> dict:
    return {"DataType": "Number", "StringValue": v}


def A(*v: object) -> dict:
    return {"DataType": "String.Array", "StringValue": json.dumps(list(v))}


EXAMPLE_ATTRIBUTES = {"customer_interests": A("soccer", "rugby", "hockey"), "store": S("example_corp"),
                      "event": S("order_placed"), "price_usd": N("210.75"),
                      "image": {"DataType": "Binary", "BinaryValue": "aGVsbG8="}}
EXAMPLE_BODY = json.dumps({"customer_interests": ["soccer", "rugby", "hockey"], "store": "example_corp",
                           "event": "order_placed", "price_usd": 210.75})

# (policy, expected) against the documentation's example message, in both scopes
BOTH_SCOPES = [
    ({"store": ["example_corp"], "event": [{"anything-but": "order_cancelled"}],
      "customer_interests": ["rugby", "football", "baseball"], "price_usd": [{"numeric": [">=", 100]}]}, True),
    ({"store": ["example_corp"], "event": ["order_cancelled"]}, False),
    ({"customer_interests": ["rugby", "tennis"]}, True),
    ({"customer_interests": ["baseball"]}, False),
    ({"price_usd": [{"numeric": [">", 0, "<=", 150]}]}, False),
    ({"price_usd": [{"numeric": [">", 200, "<", 211]}]}, True),
    ({"price_usd": [{"numeric": ["=", 210.75]}]}, True),
    ({"price_usd": [{"numeric": ["=", 2.1075e2]}]}, True),
    ({"price_usd": [210.75]}, True),
    ({"price_usd": [{"anything-but": [100, 500]}]}, True),
    ({"price_usd": [{"anything-but": [210.75]}]}, False),
    ({"store": [{"prefix": "example"}]}, True),
    ({"store": [{"prefix": "corp"}]}, False),
    ({"store": [{"suffix": "_corp"}]}, True),
    ({"store": [{"equals-ignore-case": "EXAMPLE_CORP"}]}, True),
    ({"store": [{"anything-but": {"prefix": "ex"}}]}, False),
    ({"store": [{"anything-but": {"prefix": "zz"}}]}, True),
    ({"store": [{"anything-but": {"suffix": "corp"}}]}, False),
    ({"store": [{"anything-but": {"equals-ignore-case": ["EXAMPLE_CORP"]}}]}, False),
    ({"event": [{"anything-but": ["order_cancelled", "order_placed"]}]}, False),
    ({"customer_interests": [{"anything-but": ["soccer"]}]}, True),  # rugby is not soccer
    ({"customer_interests": [{"prefix": "hock"}]}, True),
    ({"store": [{"exists": True}]}, True),
    ({"store": [{"exists": False}]}, False),
    ({"color": [{"exists": False}]}, True),
    ({"color": [{"exists": True}]}, False),
    ({"color": ["red"]}, False),
    ({"color": [{"anything-but": "red"}]}, False),  # anything-but needs the key
    ({"store": ["example_corp", "other"], "color": ["red", {"exists": False}]}, True),
    ({"$or": [{"store": ["nope"]}, {"price_usd": [{"numeric": [">", 200]}]}]}, True),
    ({"store": ["nope"], "$or": [{"event": ["order_placed"]}, {"price_usd": [{"numeric": ["<", 10]}]}]}, False),
    ({"$or": [{"store": ["nope"]}, {"event": ["nope"]}]}, False),
    ({"store": ["Example_corp"]}, False),  # case-sensitive
    ({}, True),
]


async def test_documented_cases_in_both_scopes(conn):
    wrong = []
    for policy, expected in BOTH_SCOPES:
        if await _matches(conn, policy, "MessageAttributes", EXAMPLE_ATTRIBUTES, "not json") is not expected:
            wrong.append(("attributes", policy))
        if await _matches(conn, policy, "MessageBody", {}, EXAMPLE_BODY) is not expected:
            wrong.append(("body", policy))
    assert wrong == []


ATTRIBUTE_ONLY = [
    # strings match strings and numbers numbers: "210.75" is not the Number 210.75
    ({"price_usd": ["210.75"]}, EXAMPLE_ATTRIBUTES, False),
    ({"store": [{"numeric": [">", 0]}]}, {"store": S("5")}, False),
    ({"n": [{"numeric": [">", 0]}]}, {"n": N(" 1e2 ")}, True),
    ({"n": [{"anything-but": [100, 500]}]}, {"n": {"DataType": "Number.Array", "StringValue": "[100, 50]"}}, True),
    ({"n": [{"anything-but": [100, 500]}]}, {"n": N("100")}, False),
    ({"n": [{"prefix": "1"}]}, {"n": N("100")}, False),  # prefixes are for strings only
    ({"image": [{"exists": True}]}, EXAMPLE_ATTRIBUTES, False),  # binary attributes are not compared
    ({"ip": [{"cidr": "10.0.0.0/24"}]}, {"ip": S("10.0.0.255")}, True),
    ({"ip": [{"cidr": "10.0.0.0/24"}]}, {"ip": S("10.0.1.1")}, False),
    ({"ip": [{"cidr": "10.0.0.1/24"}]}, {"ip": S("10.0.0.7")}, True),
    ({"ip": [{"cidr": "2001:db8::/32"}]}, {"ip": S("2001:db8::1")}, True),
    ({"ip": [{"cidr": "10.0.0.0/24"}]}, {"ip": S("not an ip")}, False),
    ({"color": [{"exists": False}]}, {}, False),  # needs at least one attribute present
    ({"a": ["x"]}, {"a": A("y", "x")}, True),
    ({"a": [{"numeric": [">", 1]}]}, {"a": A("y", 2)}, True),
    ({"a": ["[\"x\"]"]}, {"a": S("[\"x\"]")}, True),  # a String that looks like an array stays a string
    ({"a": ["x"]}, {"a": {"DataType": "String.Array", "StringValue": "[not json"}}, False),
    ({"a": ["v"]}, {"a": {"DataType": "String.custom", "StringValue": "v"}}, True),
]


async def test_attribute_cases(conn):
    wrong = [(p, a) for p, a, expected in ATTRIBUTE_ONLY
             if await _matches(conn, p, "MessageAttributes", a, "") is not expected]
    assert wrong == []


BODY_ONLY = [
    ({"customer": {"address": {"city": ["Paris"]}}}, {"customer": {"address": {"city": "Paris"}}}, True),
    ({"customer": {"address": {"city": ["Paris"]}}}, {"customer": {"address": {"city": "Rome"}}}, False),
    ({"customer": {"address": {"city": ["Paris"]}}}, {"customer": "Paris"}, False),
    ({"items": {"sku": ["a"]}}, {"items": [{"sku": "b"}, {"sku": "a"}]}, True),
    ({"items": {"sku": ["c"]}}, {"items": [{"sku": "b"}, {"sku": "a"}]}, False),
    ({"flag": [True]}, {"flag": True}, True),
    ({"flag": [True]}, {"flag": "true"}, False),
    ({"x": [None]}, {"x": None}, True),
    ({"x": [{"exists": True}]}, {"x": None}, False),
    ({"x": [{"exists": False}]}, {"y": 1}, True),
    ({"a": {"b": [{"exists": False}]}}, {"a": {"c": 1}}, True),
    ({"n": [{"numeric": ["<", 0]}]}, {"n": -0.5}, True),
    ({"$or": [{"a": {"b": ["1"]}}, {"c": ["2"]}]}, {"a": {"b": "1"}}, True),
]


def SA(text: str) -> dict:
    return {"DataType": "String.Array", "StringValue": text}


# SNS compares numbers "with five digits of accuracy after the decimal point": both sides
# are rounded to five decimal places first
FIVE_DIGITS = [
    ({"n": [{"numeric": ["=", 1]}]}, N("1.000004"), True),
    ({"n": [{"numeric": ["=", 1]}]}, N("1.000005"), False),  # rounds to 1.00001
    ({"n": [{"numeric": ["=", 1]}]}, N("1.00001"), False),
    ({"n": [{"numeric": ["=", 0.1]}]}, N("0.10000049"), True),
    ({"n": [{"numeric": ["=", 1.000004]}]}, N("1"), True),  # the policy's number too
    ({"n": [1]}, N("0.999996"), True),
    ({"n": [1]}, N("0.99999"), False),
    ({"n": [{"anything-but": [1]}]}, N("1.000001"), False),
    ({"n": [{"anything-but": [1]}]}, N("1.00001"), True),
    ({"n": [{"numeric": [">", 0]}]}, N("0.000004"), False),
    ({"n": [{"numeric": [">", 0]}]}, N("0.00001"), True),
    ({"n": [{"numeric": ["<=", 0]}]}, N("0.000004"), True),
    ({"n": [{"numeric": [">=", 2.5, "<", 3]}]}, N("2.4999951"), True),
    ({"n": [{"numeric": [">", -1e9, "<", 1e9]}]}, N("-999999999.99999"), True),
    ({"n": [{"numeric": [">", -1e9, "<", 1e9]}]}, N("-999999999.999996"), False),  # rounds to -1e9
]


@pytest.mark.parametrize(("policy", "attribute", "expected"), FIVE_DIGITS)
async def test_numbers_are_compared_to_five_decimal_places(conn, policy, attribute, expected):
    assert await _matches(conn, policy, "MessageAttributes", {"n": attribute}, "") is expected
    body = json.dumps({"n": json.loads(attribute["StringValue"])})
    assert await _matches(conn, policy, "MessageBody", {}, body) is expected


# a String.Array value that is not a JSON array is one value: the JSON value it is, or its text
ARRAY_OF_ONE = [
    ({"a": ["x"]}, SA("x"), True),
    ({"a": [{"prefix": "not an"}]}, SA("not an array"), True),
    ({"a": ["quoted"]}, SA('"quoted"'), True),
    ({"a": [5]}, SA("5"), True),
    ({"a": [{"numeric": [">", 4]}]}, SA("5.0"), True),
    ({"a": [True]}, SA("true"), True),
    ({"a": ["y"]}, SA("x"), False),
    ({"a": [{"exists": True}]}, SA("x"), True),
    ({"a": ['{"k": 1}']}, SA('{"k": 1}'), True),  # an object is not a value: its text is
    ({"a": ["x"]}, SA('["y", "x"]'), True),  # a real array: any element
]


@pytest.mark.parametrize(("policy", "attribute", "expected"), ARRAY_OF_ONE)
async def test_a_string_array_that_is_not_an_array_is_one_value(conn, policy, attribute, expected):
    assert await _matches(conn, policy, "MessageAttributes", {"a": attribute}, "") is expected


async def test_body_cases(conn):
    wrong = [(p, b) for p, b, expected in BODY_ONLY
             if await _matches(conn, p, "MessageBody", {}, json.dumps(b)) is not expected]
    assert wrong == []


async def test_a_body_that_is_not_a_json_object_never_matches(conn):
    for body in ("plain text", "[1, 2]", '"a string"', "{broken", ""):
        assert not await _matches(conn, {"a": [{"exists": False}]}, "MessageBody", {}, body)
    assert await _matches(conn, {}, "MessageBody", {}, "plain text")  # an empty policy takes all


async def _matches(conn, policy, scope, attributes, body) -> bool:
    cur = await conn.execute("SELECT conveyor.filter_policy_matches(%s, %s, %s, %s)",
                             (Jsonb(filter_policy.validate(policy, scope)), scope, Jsonb(attributes), body))
    return (await cur.fetchone())[0]


# -- a property test of the operators against a Python oracle ----------------------------------

strings = st.text(alphabet="abAB", min_size=1, max_size=4)
numbers = st.one_of(st.integers(-5, 5), st.integers(-50, 50).map(lambda i: i / 10))
values = st.one_of(strings.map(lambda s: ("String", s)), numbers.map(lambda n: ("Number", n)))


@st.composite
def conditions(draw):
    kind = draw(st.sampled_from(["string", "number", "prefix", "suffix", "equals-ignore-case",
                                 "anything-but", "numeric", "exists"]))
    if kind == "string":
        return draw(strings)
    if kind == "number":
        return draw(numbers)
    if kind in ("prefix", "suffix", "equals-ignore-case"):
        return {kind: draw(strings)}
    if kind == "anything-but":
        return {kind: draw(st.one_of(strings, numbers, st.lists(strings, min_size=1, max_size=3),
                                     st.lists(numbers, min_size=1, max_size=3)))}
    if kind == "exists":
        return {kind: draw(st.booleans())}
    lo, hi = sorted(draw(st.lists(numbers, min_size=2, max_size=2, unique=True)))
    ranges = [[draw(st.sampled_from(["=", "<", "<=", ">", ">="])), lo],
              [draw(st.sampled_from([">", ">="])), lo, draw(st.sampled_from(["<", "<="])), hi]]
    return {kind: draw(st.sampled_from(ranges))}


def _cmp(op: str, x: Decimal, v: Decimal) -> bool:
    return {"=": x == v, "<": x < v, "<=": x <= v, ">": x > v, ">=": x >= v}[op]


def _dec(n: float) -> Decimal:
    return Decimal(repr(n))


def oracle(cond, value) -> bool:
    """SNS's semantics for one condition against one attribute (None: absent)."""
    if isinstance(cond, dict) and "exists" in cond:
        return (value is not None) == cond["exists"]
    if value is None:
        return False
    vtype, v = value
    if isinstance(cond, str):
        return vtype == "String" and v == cond
    if isinstance(cond, (int, float)):
        return vtype == "Number" and _dec(v) == _dec(cond)
    [(op, arg)] = cond.items()
    if op == "prefix":
        return vtype == "String" and v.startswith(arg)
    if op == "suffix":
        return vtype == "String" and v.endswith(arg)
    if op == "equals-ignore-case":
        return vtype == "String" and v.lower() == arg.lower()
    if op == "anything-but":
        others = arg if isinstance(arg, list) else [arg]
        same = [o for o in others if isinstance(o, str) == (vtype == "String")]
        return not any(o == v if vtype == "String" else _dec(o) == _dec(v) for o in same)
    if op == "numeric":
        return vtype == "Number" and all(_cmp(o, _dec(v), _dec(b)) for o, b in zip(arg[0::2], arg[1::2], strict=False))
    raise AssertionError(op)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(conds=st.lists(conditions(), min_size=1, max_size=3), value=st.one_of(st.none(), values))
def test_operators_agree_with_the_oracle(sync_conn, conds, value):
    policy = {"k": conds}
    attributes = {"other": S("x")}  # never empty: "exists": false needs some attribute
    if value is not None:
        attributes["k"] = {"DataType": value[0], "StringValue": str(value[1])}
    expected = any(oracle(c, value) for c in conds)
    got = sync_conn.execute("SELECT conveyor.filter_policy_matches(%s, 'MessageAttributes', %s, '')",
                            (Jsonb(filter_policy.validate(policy)), Jsonb(attributes))).fetchone()[0]
    assert got is expected, (policy, attributes)


@pytest.fixture
def sync_conn(dsn):
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
