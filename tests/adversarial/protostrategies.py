"""Hypothesis strategies for any protobuf message, built from its descriptor.

Every field gets values a hostile peer would pick, not only plausible ones:
integer extremes (0, 1, 2**31-1, 2**63-1, 2**64-1, negatives), NaN and
infinities, strings with control characters, ESC sequences and non-BMP text,
enum numbers this release does not know, Timestamps outside their range,
unset and set submessages, repeated fields and maps of a few entries (the
size bounds are exercised by the exhaustion tests, not here).
"""

from __future__ import annotations

from functools import lru_cache

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

F = FieldDescriptor
MAX_DEPTH = 4
MAX_ITEMS = 4


def _ints(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in (0, 1, -1, 2, low, high, low + 1, high - 1, 2**31 - 1, 2**32 - 1, 2**48, 2**48 + 1,
                         2**53, 2**63 - 1, -(2**63)) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(low, high),
                     st.integers(0, 1000).filter(lambda v: low <= v <= high))


HOSTILE_TEXT = st.sampled_from([
    "", "eth0", "rail0", "198.18.0.1", "\x1b]0;pwned\x07", "\x1b[2J\x1b[H", "\x9b2J", "\u202eevil", "a\r\nb",
    "\x00", "x" * 300, "😀" * 10, "../../etc/passwd", "%s%n", "<script>alert(1)</script>",
])
TEXT = st.one_of(HOSTILE_TEXT, st.text(max_size=40))

SCALARS = {
    F.TYPE_INT32: _ints(-(2**31), 2**31 - 1), F.TYPE_SINT32: _ints(-(2**31), 2**31 - 1),
    F.TYPE_SFIXED32: _ints(-(2**31), 2**31 - 1),
    F.TYPE_UINT32: _ints(0, 2**32 - 1), F.TYPE_FIXED32: _ints(0, 2**32 - 1),
    F.TYPE_INT64: _ints(-(2**63), 2**63 - 1), F.TYPE_SINT64: _ints(-(2**63), 2**63 - 1),
    F.TYPE_SFIXED64: _ints(-(2**63), 2**63 - 1),
    F.TYPE_UINT64: _ints(0, 2**64 - 1), F.TYPE_FIXED64: _ints(0, 2**64 - 1),
    F.TYPE_BOOL: st.booleans(),
    F.TYPE_DOUBLE: st.one_of(st.floats(), st.sampled_from([0.0, -1.0, 1e300, float("nan"), float("inf")])),
    F.TYPE_FLOAT: st.floats(width=32),
    F.TYPE_STRING: TEXT,
    F.TYPE_BYTES: st.binary(max_size=64),
}


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.type == F.TYPE_MESSAGE:
        return _message(field.message_type, depth + 1)
    if field.type == F.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.one_of(st.sampled_from(known), _ints(-(2**31), 2**31 - 1))
    return SCALARS[field.type]


def _is_map(field: FieldDescriptor) -> bool:
    return field.type == F.TYPE_MESSAGE and field.message_type.GetOptions().map_entry


@lru_cache(maxsize=None)
def _message(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy:
    from google.protobuf import message_factory

    cls = message_factory.GetMessageClass(descriptor)
    if depth > MAX_DEPTH:
        return st.just(cls())
    parts = {}
    for field in descriptor.fields:
        if _is_map(field):
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            parts[field.name] = st.dictionaries(_field(key, depth), _field(value, depth), max_size=MAX_ITEMS)
        elif field.is_repeated:
            parts[field.name] = st.lists(_field(field, depth), max_size=MAX_ITEMS)
        else:
            parts[field.name] = st.one_of(st.none(), _field(field, depth))
    oneofs = {o.name: [f.name for f in o.fields] for o in descriptor.oneofs}

    @st.composite
    def build(draw):
        msg = cls()
        chosen = {name: draw(st.sampled_from([None, *fields])) for name, fields in oneofs.items()}
        in_oneof = {f for fields in oneofs.values() for f in fields}
        for field in descriptor.fields:
            if field.name in in_oneof and chosen[field.containing_oneof.name] != field.name:
                continue
            value = draw(parts[field.name])
            if value is None:
                continue
            target = getattr(msg, field.name)
            if _is_map(field):
                vf = field.message_type.fields_by_name["value"]
                for k, v in value.items():
                    if vf.type == F.TYPE_MESSAGE:
                        target[k].CopyFrom(v)
                    else:
                        target[k] = v
            elif field.is_repeated:
                if field.type == F.TYPE_MESSAGE:
                    for v in value:
                        target.add().CopyFrom(v)
                else:
                    target.extend(value)
            elif field.type == F.TYPE_MESSAGE:
                target.CopyFrom(value)
            else:
                setattr(msg, field.name, value)
        return msg

    return build()


def messages(message_class) -> st.SearchStrategy:
    """Messages of `message_class`, any field set to anything its type holds."""
    return _message(message_class.DESCRIPTOR)
