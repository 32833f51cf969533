"""JsonArrayFramer and its parts: the same items, problems and offsets whatever the chunking."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from dataguard.io import json_keypath
from dataguard.io.bounded import Oversize
from dataguard.io.json_window import ByteWindow
from dataguard.io.jsonscan import FrameError, JsonArrayFramer, Problem, json_balance, json_depth

REPO = Path(__file__).resolve().parent.parent
CHUNKS = [1, 2, 3, 7, 64, 1 << 20]
TRICKY = b'[{"a": "x\\\\\\"y", "b": [1, {"c": "]}\\\\"}]}, {"k":"\\\\\\\\"} , 3, "s,]}", null]'


def frame(data: bytes, chunk: int, keys: tuple[str, ...] = (), max_bytes: int = 1 << 20,
          max_depth: int = 100) -> list[bytes | Oversize | Problem]:
    framer = JsonArrayFramer(list(keys), max_bytes, max_depth)
    out: list[bytes | Oversize | Problem] = []
    for i in range(0, len(data), chunk):
        if framer.done:
            break
        out += framer.feed(data[i:i + chunk])
    return out + framer.finish()


def error(data: bytes, chunk: int, keys: tuple[str, ...] = ()) -> FrameError:
    with pytest.raises(FrameError) as info:
        frame(data, chunk, keys)
    return info.value


@pytest.mark.parametrize("chunk", CHUNKS)
def test_items_are_the_parsed_items_whatever_the_chunking(chunk: int) -> None:
    items = frame(TRICKY, chunk)
    assert [json.loads(i) for i in items] == json.loads(TRICKY)  # type: ignore[arg-type]


@pytest.mark.parametrize("path", ["sample_data/alpaca_en_demo.json", "sample_data/messages_kto_demo.json",
                                  "sample_data/sharegpt_glaive_toolcall.json"])
def test_sample_arrays_frame_into_their_records(path: str) -> None:
    data = (REPO / path).read_bytes()
    records = json.loads(data)
    for chunk in (997, 65536, 1 << 20):
        assert [json.loads(i) for i in frame(data, chunk)] == records  # type: ignore[arg-type]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_damage_is_reported_with_reason_detail_and_offsets(chunk: int) -> None:
    assert frame(b"[1,,2]", chunk) == [b"1", Problem("invalid_json", "empty item at byte 3 (a stray or trailing "
                                                     "comma)", b""), b"2"]
    assert frame(b"[]", chunk) == [] and frame(b"[  \n ]", chunk) == []
    one, stray = frame(b"[1, 2}, 3]", chunk)
    assert one == b"1" and isinstance(stray, Problem) and stray.head.startswith(b"2")  # head: what was buffered
    assert (stray.reason, stray.detail) == ("invalid_json", "a '}' at byte 5 closes the JSON array after 1 items; "
                                            "the rest of the file could not be read")
    assert frame(b'[1, {"a": "bc', chunk) == [b"1", Problem(
        "invalid_json", "the file ends inside the JSON array after 1 items (truncated?); the last 10 bytes are "
        "not a complete item", b'{"a": "bc')]
    one, after = frame(b"[1] xx", chunk)
    assert one == b"1" and isinstance(after, Problem) and after.head in (b"x", b"xx")  # head: from its first chunk
    assert (after.reason, after.detail) == ("invalid_json", "data after the end of the JSON array (after 1 items)")
    start = next(c for c in (b"  hello"[i:i + chunk] for i in range(0, 7, chunk)) if c.strip()).lstrip()
    assert frame(b"  hello", chunk) == [Problem("invalid_json", f"not a JSON array: the file starts with "
                                                f"{start.decode()!r}", start)]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_items_over_the_limits_are_never_parsed(chunk: int) -> None:
    big = b'"' + b"x" * 300 + b'"'
    out = frame(b"[1, " + big + b", 2]", chunk, max_bytes=100)
    assert out[0] == b"1" and out[2] == b"2"
    assert isinstance(out[1], Oversize) and out[1].size == len(big) + 1  # from after the comma
    assert out[1].sha256 == hashlib.sha256(b" " + big).hexdigest()
    deep = b"[" * 5 + b"]" * 5
    assert frame(b"[" + deep + b", 1]", chunk, max_depth=3) == [
        Problem("too_deep", "item nests arrays/objects deeper than the limit 3", deep), b"1"]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_arrays_under_keys_and_the_errors_naming_the_keys(chunk: int) -> None:
    doc = b'{"meta": {"data": 0}, "a": {"b": [1, [2]]}, "data": [{"x": 1}, 3], "z": 4}'
    assert frame(doc, chunk, ("data",)) == [b'{"x": 1}', b"3"]
    assert frame(doc, chunk, ("a", "b")) == [b"1", b"[2]"]
    e = error(doc, chunk)
    assert (e.kind, e.found, e.complete) == ("object", ["meta", "a", "data", "z"], True)
    assert error(doc, chunk, ("nope",)).kind == "missing"
    assert error(doc, chunk, ("meta",)).kind == "not_array"
    assert error(b'{"data": 5}', chunk, ("data",)).kind == "not_array"
    assert error(b"[1]", chunk, ("data",)).kind == "is_array"


def test_keys_are_probed_only_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_keypath, "PROBE_BYTES", 20)
    doc = b"{" + b",".join(b'"k%d": %d' % (i, i) for i in range(20)) + b"}"
    e = error(doc, 7)
    assert e.kind == "object" and not e.complete and e.found[:2] == ["k0", "k1"] and len(e.found) < 20


def test_depth_and_balance_without_parsing() -> None:
    assert json_depth(b'{"a": [[1], "]]]"]}') == 3 and json_depth(b"5") == 0
    assert json_balance(b'{"a": [1') == 2 and json_balance(b'{"a": "{"}') == 0


def test_window_addresses_stream_offsets_after_it_is_trimmed() -> None:
    w = ByteWindow()
    w.skip(3)
    w.forget_before(3)
    w.add(b"abcdef")
    w.forget_before(5)
    assert (w.start, w.end, w.get(6), w.get(5, 7)) == (5, 9, b"def", b"cd")


def test_the_compiled_scanner_matches_the_numpy_one_across_any_cuts() -> None:
    """Same events and carried state (in a string, the backslash run) as the NumPy reference,
    on random bytes rich in quotes, backslashes and brackets, cut anywhere."""
    import random

    from dataguard.io import json_structure
    from dataguard.io.json_structure import JsonScanner

    assert json_structure._compiled is not None  # built at install: the fast path is the one in use
    rng = random.Random(7)
    alphabet = b'ab"\\[]{},: \n\xc3\xa9'
    for _ in range(2000):
        data = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        fast, ref = JsonScanner(), JsonScanner()
        fast.in_string = ref.in_string = rng.random() < 0.3
        fast.backslashes = ref.backslashes = rng.randint(0, 3)
        cuts = sorted(rng.sample(range(len(data) + 1), min(4, len(data) + 1)))
        for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
            (p1, k1), (p2, k2) = fast.events(data[a:b]), ref.numpy_events(data[a:b])
            assert p1.dtype == p2.dtype and k1.dtype == k2.dtype
            assert p1.tolist() == p2.tolist() and k1.tolist() == k2.tolist(), data
            assert (fast.in_string, fast.backslashes) == (ref.in_string, ref.backslashes), data
    with pytest.raises(ValueError, match="backslashes"):
        json_structure._compiled.events(b"[]", False, -1)
