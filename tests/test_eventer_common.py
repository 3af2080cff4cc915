"""Eventer values against hat-event's own: subscriptions, SBS shapes and bytes, the
MsgRegisterReq splitter, config files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hat.event import common as hat
from hypothesis import given
from hypothesis import strategies as st

from rpc.eventer import common
from rpc.eventer.config import ConfigError, config_from_dict, load_config
from wire.chatter import encode_integer

segments = st.sampled_from(["a", "b", "c"])
event_types = st.lists(segments, max_size=4).map(tuple)
query_types = st.tuples(st.lists(st.sampled_from(["a", "b", "?"]), max_size=3), st.booleans()).map(
    lambda t: (*t[0], "*") if t[1] else tuple(t[0])
)


@given(event_types, st.lists(query_types, max_size=3))
def test_subscription_matches_like_hat(event_type, queries) -> None:
    ours = common.Subscription(queries)
    reference = hat.create_subscription(queries)
    assert ours.matches(event_type) == reference.matches(event_type)
    assert ours.matches(event_type) == any(hat.matches_query_type(event_type, q) for q in queries)


def test_subscription_rules() -> None:
    sub = common.Subscription([("a", "*"), ("b", "?", "c")])
    assert sub.matches(("a",)) and sub.matches(("a", "x", "y"))
    assert sub.matches(("b", "x", "c")) and not sub.matches(("b", "c"))
    assert not common.Subscription([]).matches(("a",))
    assert common.Subscription([()]).matches(()) and not common.Subscription([()]).matches(("a",))
    assert common.Subscription([("*",)]).matches_all
    with pytest.raises(ValueError, match="last segment"):
        common.Subscription([("a", "*", "b")])


def test_subscription_limits_segments_and_matches_at_any_depth() -> None:
    """Matching used to recurse once per segment: RecursionError past about 1,000."""
    limit = common.MAX_TYPE_SEGMENTS
    common.Subscription([("a",) * limit])
    with pytest.raises(ValueError, match="segments"):
        common.Subscription([("a",) * (limit + 1)])
    deep = 5000
    sub = common.Subscription(
        [("a",) * deep, ("?",) * (deep - 1) + ("b", "*")], max_segments=deep + 1
    )
    assert sub.matches(("a",) * deep) and not sub.matches(("a",) * (deep - 1))
    assert not sub.matches(("a",) * (deep + 1))
    assert sub.matches(("x",) * (deep - 1) + ("b",)) and sub.matches(
        ("x",) * (deep - 1) + ("b", "c")
    )
    assert not sub.matches(("x",) * (deep - 1) + ("c",))


timestamps = st.builds(common.Timestamp, st.integers(-(2**40), 2**40), st.integers(0, 999_999))
payloads = st.one_of(
    st.none(),
    st.builds(common.EventPayloadBinary, st.text(max_size=5), st.binary(max_size=8)),
    st.builds(
        common.EventPayloadJson,
        st.recursive(
            st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=4),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=3), inner, max_size=3)
            ),
            max_leaves=5,
        ),
    ),
)
register_events = st.builds(
    common.RegisterEvent,
    st.lists(st.text(max_size=6), max_size=4).map(tuple),
    st.none() | timestamps,
    payloads,
)


def to_hat_payload(payload):
    if isinstance(payload, common.EventPayloadJson):
        return hat.EventPayloadJson(payload.data)
    if isinstance(payload, common.EventPayloadBinary):
        return hat.EventPayloadBinary(payload.type, payload.data)
    return None


def hat_register_event(event: common.RegisterEvent) -> Any:
    """hat-event's RegisterEvent for ours."""
    source = event.source_timestamp
    return hat.RegisterEvent(
        event.type,
        None if source is None else hat.Timestamp(*source),
        to_hat_payload(event.payload),
    )


def hat_register_req(events: list[common.RegisterEvent]) -> bytes:
    """The MsgRegisterReq hat-sbs writes for ``events``."""
    hat_events = [hat.register_event_to_sbs(hat_register_event(e)) for e in events]
    return hat.sbs_repo.encode("HatEventer.MsgRegisterReq", hat_events)


@given(st.lists(register_events, max_size=5), st.integers(0, 2**40), st.integers(0, 2**31))
def test_register_splitting_builds_hat_event_bytes(events, session, server) -> None:
    """Splicing id + type + timestamp + tail gives exactly hat-sbs' Event bytes."""
    hat_events = [hat_register_event(e) for e in events]
    data = hat_register_req(events)
    parts = common.split_register_req(data)
    ts = hat.Timestamp(1_700_000_000, 42)
    for instance, (part, reg) in enumerate(zip(parts, hat_events, strict=True), 1):
        assert part.type == reg.type
        expected_src = (
            None if reg.source_timestamp is None else common.Timestamp(*reg.source_timestamp).key()
        )
        assert part.source_key == expected_src
        spliced = (
            encode_integer(server)
            + encode_integer(session)
            + encode_integer(instance)
            + part.type_bytes
            + encode_integer(ts.s)
            + encode_integer(ts.us)
            + part.tail_bytes
        )
        event = hat.Event(
            hat.EventId(server, session, instance),
            reg.type,
            ts,
            reg.source_timestamp,
            reg.payload,
        )
        assert spliced == hat.sbs_repo.encode("HatEventer.Event", hat.event_to_sbs(event))
        decoded = common.event_from_sbs(common.decode("HatEventer.Event", spliced))
        assert decoded.payload == events[instance - 1].payload


def test_register_splitting_rejects_malformed_input() -> None:
    event = common.RegisterEvent(("a", "bé"), common.Timestamp(5, 6), common.EventPayloadJson([1]))
    other = common.RegisterEvent(("c",), None, common.EventPayloadBinary("t", b"\x00\x01"))
    data = common.encode(
        common.MSG_REGISTER_REQ,
        [common.register_event_to_sbs(event), common.register_event_to_sbs(other)],
    )
    assert [p.type for p in common.split_register_req(data)] == [("a", "bé"), ("c",)]
    for cut in range(len(data)):
        with pytest.raises(common.InvalidMessage):
            common.split_register_req(data[:cut])
    with pytest.raises(common.InvalidMessage, match="trailing"):
        common.split_register_req(data + b"\x80")
    with pytest.raises(common.InvalidMessage, match="int64"):
        common.split_register_req(b"\x81\x81\x3f" + b"\x7f" * 8 + b"\xff")
    with pytest.raises(common.InvalidMessage):
        common.split_register_req(b"\x81\x81\x82\xff\xfe")  # bad UTF-8
    with pytest.raises(common.InvalidMessage, match="choice"):
        common.split_register_req(b"\x81\x80\x85")


# Random bytes alone are never a MsgRegisterReq (100 of 100 examples refused, so the
# comparison with hat-sbs never ran): requests hat-sbs writes are drawn too.
register_reqs = st.lists(register_events, max_size=3).map(hat_register_req)


@given(st.binary(max_size=40) | register_reqs)
def test_register_splitting_agrees_with_hat_sbs(data: bytes) -> None:
    """Random bytes: either InvalidMessage, or the same events hat-sbs decodes."""
    try:
        parts = common.split_register_req(data)
    except common.InvalidMessage:
        return
    decoded = hat.sbs_repo.decode("HatEventer.MsgRegisterReq", data)
    assert [p.type for p in parts] == [tuple(e["type"]) for e in decoded]


@given(register_events)
def test_register_event_sbs_shape_is_hats(event) -> None:
    ours = common.register_event_to_sbs(event)
    theirs = hat.register_event_to_sbs(hat_register_event(event))
    # JSON text spacing differs (hat writes '{"x": 1}'); the values must not
    assert common.register_event_from_sbs(theirs) == common.register_event_from_sbs(ours)
    assert common.register_event_from_sbs(ours) == event


def hat_params(params):
    ts = lambda t: None if t is None else hat.Timestamp(*t)  # noqa: E731
    if isinstance(params, common.QueryLatestParams):
        return hat.QueryLatestParams(params.event_types)
    if isinstance(params, common.QueryServerParams):
        last = params.last_event_id
        return hat.QueryServerParams(
            params.server_id,
            params.persisted,
            params.max_results,
            None if last is None else hat.EventId(*last),
        )
    return hat.QueryTimeseriesParams(
        params.event_types,
        ts(params.t_from),
        ts(params.t_to),
        ts(params.source_t_from),
        ts(params.source_t_to),
        hat.Order(params.order.value),
        hat.OrderBy(params.order_by.value),
        params.max_results,
        None if params.last_event_id is None else hat.EventId(*params.last_event_id),
    )


types_list = st.none() | st.lists(event_types, max_size=3)
event_ids = st.builds(common.EventId, st.integers(0, 99), st.integers(0, 99), st.integers(0, 99))
query_params = st.one_of(
    st.builds(common.QueryLatestParams, types_list),
    st.builds(
        common.QueryTimeseriesParams,
        types_list,
        st.none() | timestamps,
        st.none() | timestamps,
        st.none() | timestamps,
        st.none() | timestamps,
        st.sampled_from(common.Order),
        st.sampled_from(common.OrderBy),
        st.none() | st.integers(0, 100),
        st.none() | event_ids,
    ),
    st.builds(
        common.QueryServerParams,
        st.integers(0, 99),
        st.booleans(),
        st.none() | st.integers(0, 100),
        st.none() | event_ids,
    ),
)


@given(query_params)
def test_query_params_bytes_are_hats(params) -> None:
    ours = common.encode(common.MSG_QUERY_REQ, common.query_params_to_sbs(params))
    theirs = hat.sbs_repo.encode(
        "HatEventer.MsgQueryReq", hat.query_params_to_sbs(hat_params(params))
    )
    assert ours == theirs
    assert common.query_params_from_sbs(common.decode(common.MSG_QUERY_REQ, ours)) == params


def test_timestamps() -> None:
    assert common.Timestamp(1, 500).to_us() == 1_000_500
    assert common.Timestamp.from_us(-1) == common.Timestamp(-1, 999_999)
    assert common.Timestamp(2**62, 0).to_us() == common.INT64_MAX
    assert common.Timestamp(-(2**62), 0).to_us() == common.INT64_MIN
    now = common.now()
    assert 0 <= now.us < 1_000_000 and now.s > 1_600_000_000


def test_decode_errors_are_typed() -> None:
    with pytest.raises(common.InvalidMessage):
        common.decode(common.MSG_INIT_REQ, b"\x83ab")


# --- config ----------------------------------------------------------------------------------


def test_config_files(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(
        'listen = "tcp+sbs://127.0.0.1:0?dialect=HatChatter"\n'
        'server_id = 3\ntoken = "t"\ndatabase = "db/events.db"\n'
        '[tls]\ncert = "c.pem"\n'
    )
    with pytest.raises(ConfigError, match=r"^tls\.cert: no such file .*/c\.pem$"):
        load_config(tmp_path / "a.toml")  # named, not a bare [Errno 2] at listen time
    (tmp_path / "c.pem").write_text("")  # existence is checked here, content at listen time
    config = load_config(tmp_path / "a.toml")
    assert config.listen == ["tcp+sbs://127.0.0.1:0?dialect=HatChatter"]
    assert (config.server_id, config.token, config.sync) == (3, "t", "full")
    assert config.database == str(tmp_path / "db" / "events.db")
    assert config.tls is not None and config.tls.cert == str(tmp_path / "c.pem")

    (tmp_path / "b.json").write_text(
        '{"listen": ["tcp+sbs://127.0.0.1:1", "tcp+sbs://127.0.0.1:2"], "database": ":memory:"}'
    )
    config = load_config(tmp_path / "b.json")
    assert len(config.listen) == 2 and config.database == ":memory:"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"listen": []}, "at least one"),
        ({"listen": "tcp+gotalk://127.0.0.1:1"}, "not a Chatter"),
        ({"listen": "ssl+sbs://127.0.0.1:1"}, "tls"),
        ({"listen": "nope://x"}, "unsupported scheme"),
        ({"listen": "tcp+sbs://127.0.0.1:1", "databse": "x"}, "databse"),
        ({"listen": "tcp+sbs://127.0.0.1:1", "sync": "off"}, "sync"),
        ({"listen": "tcp+sbs://127.0.0.1:1", "server_id": "1"}, "server_id"),
        ({}, "listen"),
    ],
)
def test_config_errors(data, message) -> None:
    with pytest.raises(ConfigError, match=message):
        config_from_dict(data)


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    (tmp_path / "bad.toml").write_text("listen = [")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_config(tmp_path / "bad.toml")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ConfigError, match="top level"):
        load_config(tmp_path / "list.json")
